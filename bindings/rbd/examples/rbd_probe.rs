//! Probe against a running cluster: `rbd_probe CONF POOL IMAGE` runs every asynchronous op once
//! on the image (which it overwrites) and prints what completes through the event queue.
use riser_buf::IoBuf;
use riser_rbd::{AioOp, Cluster, ClusterConfig, Image, Pool};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 4 {
        eprintln!("usage: rbd_probe CONF POOL IMAGE");
        std::process::exit(2);
    }
    let cfg = ClusterConfig { config_file: Some(a[1].clone()), ..Default::default() };
    let c = Cluster::connect(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let p = Pool::open(&c, &a[2]).unwrap_or_else(|e| panic!("{e}"));
    let mut img = Image::open(&p, &a[3]).unwrap_or_else(|e| panic!("{e}"));
    let mut tag = 0u64;
    let mut run = |img: &mut Image, op: AioOp, off: u64, buf: Option<IoBuf>| {
        tag += 1;
        img.submit(op, off, buf, tag).map_err(|(e, _)| e).unwrap_or_else(|e| panic!("{e}"));
        let t = std::time::Instant::now();
        let mut out = Vec::new();
        while img.poll(&mut out) == 0 {
            if t.elapsed().as_secs() > 5 {
                println!("{op:?}: no completion in 5 s");
                return None;
            }
            std::thread::yield_now();
        }
        let d = out.pop()?;
        println!("{op:?} (tag {tag}): completion of tag {} ret {} mismatch {:?} in {:?}", d.tag, d.ret, d.mismatch, t.elapsed());
        d.buf
    };
    run(&mut img, AioOp::Write, 4096, Some(IoBuf::copy_from(&[1u8; 4096])));
    let b = run(&mut img, AioOp::Read, 4096, Some(IoBuf::zeroed(4096)));
    println!("read back ok: {}", b.is_some_and(|b| b.as_slice().iter().all(|&x| x == 1)));
    // librbd 16.2 compares and writes within one 512-byte sector only.
    let mut caw = vec![1u8; 512];
    caw.extend(vec![2u8; 512]);
    run(&mut img, AioOp::CompareAndWrite, 4096 + 512, Some(IoBuf::copy_from(&caw)));
    let mut caw = vec![2u8; 512];
    caw[100] = 9;
    caw.extend(vec![3u8; 512]);
    run(&mut img, AioOp::CompareAndWrite, 4096 + 512, Some(IoBuf::copy_from(&caw)));
    let b = run(&mut img, AioOp::Read, 4096, Some(IoBuf::zeroed(4096)));
    let b = b.map(|b| b.as_slice().to_vec()).unwrap_or_default();
    println!("after CAW: block 0 all 1: {}, block 1 all 2: {}", b[..512].iter().all(|&x| x == 1), b[512..1024].iter().all(|&x| x == 2));
    run(&mut img, AioOp::Flush, 0, None);
    run(&mut img, AioOp::WriteZeroes { len: 4096 }, 4096, None);
    run(&mut img, AioOp::Discard { len: 4096 }, 4096, None);
}
