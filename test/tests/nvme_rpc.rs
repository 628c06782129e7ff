//! bdev_nvme_* on a host without NVMe (the real riser, its RPC socket): every bad input gets
//! a clear error naming its cause and SPDK's code, nothing is created, and the listings stay
//! empty. The I/O path itself is tested on qemu's NVMe in the VM (rxe_vm_nvme.rs).

use riser_tests::{rpc_code, rpc_message, Riser};
use serde_json::json;

#[test]
fn nvme_attach_errors_are_clear_and_create_nothing() {
    let riser = Riser::start();
    let call = |m: &str, p| riser.call(m, Some(p));
    let cases = [
        (json!({"name": "N0", "trtype": "TCP", "traddr": "10.0.0.1"}), -22, "trtype \"TCP\" is not supported"),
        (json!({"name": "N0", "trtype": "PCIe", "traddr": "not-an-address"}), -22, "is not a PCI address"),
        (json!({"name": "N0", "trtype": "PCIe", "traddr": "ffff:ff:1f.7"}), -19, "no PCI device ffff:ff:1f.7"),
        (json!({"name": "N0", "trtype": "PCIe", "traddr": "0000:00:04.0", "trsvcid": "4420"}), -32602, "trsvcid: a fabrics parameter"),
        (json!({"name": "N0", "trtype": "PCIe", "traddr": "0000:00:04.0", "prchk_guard": true}), -32602, "protection information"),
        (json!({"name": "N0", "trtype": "PCIe", "traddr": "0000:00:04.0", "bogus": 1}), -32602, "bogus"),
        (json!({"name": "", "trtype": "PCIe", "traddr": "0000:00:04.0"}), -32602, "invalid name"),
    ];
    for (params, code, text) in cases {
        let r = call("bdev_nvme_attach_controller", params.clone());
        assert_eq!(rpc_code(&r), code, "{params}: {r:?}");
        assert!(rpc_message(&r).contains(text), "{params}: {:?} lacks {text:?}", rpc_message(&r));
    }
    // A PCI device that exists but is no NVMe controller bound to nvme, if the host has one.
    if let Some(dev) = std::fs::read_dir("/sys/bus/pci/devices").ok().and_then(|d| {
        d.filter_map(|e| e.ok())
            .find(|e| !e.path().join("nvme").exists())
            .and_then(|e| e.file_name().into_string().ok())
    }) {
        let r = call("bdev_nvme_attach_controller", json!({"name": "N0", "trtype": "pcie", "traddr": dev}));
        assert_eq!(rpc_code(&r), -19, "{r:?}");
        assert!(rpc_message(&r).contains("is not bound to the kernel's nvme driver"), "{r:?}");
    }
    assert_eq!(riser.call("bdev_nvme_get_controllers", None).unwrap(), json!([]));
    let r = call("bdev_nvme_get_controllers", json!({"name": "N0"}));
    assert_eq!(rpc_code(&r), -19, "{r:?}");
    let r = call("bdev_nvme_detach_controller", json!({"name": "N0"}));
    assert_eq!(rpc_code(&r), -19, "{r:?}");
    assert!(rpc_message(&r).contains("NVMe controller N0 not found"), "{r:?}");
    assert_eq!(riser.call("bdev_get_bdevs", None).unwrap(), json!([]));
}
