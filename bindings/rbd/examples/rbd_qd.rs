//! librbd through riser's binding, without iSCSI: `rbd_qd CONF POOL IMAGE read|write QD SECS [KEY=VALUE...]`
//! keeps QD random 4 KiB I/Os in flight on one image handle (as one RBD channel does),
//! sleeping on the completion eventfd between completions, and prints IOPS: to compare with
//! `rbd bench` on the same image (the binding's path: rbd_aio_readv/writev, event queue).
//! KEY=VALUE: librados/librbd options set after the file (rbd_cache=false always).
use std::os::fd::AsRawFd;

use riser_buf::IoBuf;
use riser_rbd::{AioOp, Cluster, ClusterConfig, Image, Pool};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 7 {
        eprintln!("usage: rbd_qd CONF POOL IMAGE read|write QD SECS");
        std::process::exit(2);
    }
    let mut config_param = vec![("rbd_cache".to_string(), "false".to_string())];
    for kv in &a[7..] {
        let (k, v) = kv.split_once('=').expect("KEY=VALUE");
        config_param.push((k.to_string(), v.to_string()));
    }
    let cfg = ClusterConfig { config_file: Some(a[1].clone()), config_param, ..Default::default() };
    let c = Cluster::connect(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let p = Pool::open(&c, &a[2]).unwrap_or_else(|e| panic!("{e}"));
    let mut img = Image::open(&p, &a[3]).unwrap_or_else(|e| panic!("{e}"));
    let op = if a[4] == "write" { AioOp::Write } else { AioOp::Read };
    let qd: usize = a[5].parse().expect("QD");
    let secs: f64 = a[6].parse().expect("SECS");
    let blocks = img.size().expect("size") / 4096;
    let efd = img.event_fd().expect("eventfd");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % blocks) * 4096
    };
    for t in 0..qd {
        img.submit(op, next(), Some(IoBuf::alloc(4096)), t as u64).unwrap_or_else(|(e, _)| panic!("{e}"));
    }
    let start = std::time::Instant::now();
    let (mut n, mut out) = (0u64, Vec::new());
    while start.elapsed().as_secs_f64() < secs {
        let mut pfd = libc::pollfd { fd: efd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, 100) };
        let mut b = [0u8; 8];
        // SAFETY: b is writable for 8 bytes; the fd is non-blocking.
        unsafe { libc::read(efd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        img.poll(&mut out);
        for d in out.drain(..) {
            assert!(d.ret >= 0, "I/O failed: {}", d.ret);
            n += 1;
            img.submit(op, next(), d.buf, d.tag).unwrap_or_else(|(e, _)| panic!("{e}"));
        }
    }
    println!("rbd_qd {} qd {qd}: {:.0} IOPS", a[4], n as f64 / start.elapsed().as_secs_f64());
}
