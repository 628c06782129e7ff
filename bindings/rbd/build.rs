//! Generates the librados/librbd bindings from Debian's librbd-dev headers (no pkg-config
//! file ships with them: the libraries are linked by name).

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    let header = Path::new("/usr/include/rbd/librbd.h");
    if !header.exists() {
        panic!("riser-rbd: {} is missing: install Debian's librbd-dev (scripts/setup.sh build)", header.display());
    }
    println!("cargo:rustc-link-lib=rbd");
    println!("cargo:rustc-link-lib=rados");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("rados_(create|conf_read_file|conf_set|conf_get|connect|shutdown|cluster_fsid|ioctx_create|ioctx_destroy)")
        .allowlist_function("rbd_(open|close|get_size|get_id|resize|create|remove|set_image_notification|poll_io_events)")
        // Shared state next to an image (persistent reservations): object reads, compare-and-swap writes, watch/notify.
        .allowlist_function("rados_(read|remove|get_last_version|create_write_op|release_write_op|write_op_(assert_version|create|write_full|operate)|watch2|watch_check|unwatch2|watch_flush|notify2|notify_ack|buffer_free)")
        .allowlist_var("LIBRADOS_CREATE_EXCLUSIVE")
        // Gateway liveness and fencing (issue 23): who we are, watches that expire, who acked a
        // notify, and putting a dead gateway's client on the OSD blocklist.
        .allowlist_function("rados_(get_instance_id|getaddrs|blocklist_add|wait_for_latest_osdmap|watch3|decode_notify_response|free_notify_response)")
        // A device's identity derives from its image: the pool's id.
        .allowlist_function("rados_ioctx_get_id")
        .allowlist_function("rbd_aio_(readv|writev|discard|flush|write_zeroes|compare_and_write|create_completion|get_return_value|get_arg|release|wait_for_complete|is_complete)")
        .allowlist_var("EVENT_TYPE_.*")
        .size_t_is_usize(true)
        // bindgen 0.59 writes its layout tests with null-pointer dereferences newer rustc rejects.
        .layout_tests(false)
        .generate()
        .expect("riser-rbd: bindgen failed on librbd.h");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    bindings.write_to_file(out.join("bindings.rs")).expect("riser-rbd: writing bindings.rs");
}
