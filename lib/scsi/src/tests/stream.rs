//! READs that stream in pieces (`set_stream_chunk`): order, offsets, the last piece with
//! the status, memory bounded by the window, aborts.

use super::*;

const CHUNK: usize = 64 * 1024;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 512) as u8).collect()
}

/// Polls `ch` until task `tag` ends; returns its pieces (in the order they came) and its
/// final result. Each piece's buffer is dropped once copied, as a datamover does once sent.
fn collect(ch: &mut LunChannel, tag: u64, data: &mut Vec<u8>) -> (Vec<(usize, usize)>, ScsiResult) {
    let mut pieces = Vec::new();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        ch.poll(&mut out);
        for ev in out.drain(..) {
            assert_eq!(ev.tag(), tag);
            match ev {
                TaskEvent::Data(p) => {
                    if p.len > 0 {
                        assert_eq!(p.offset as usize, data.len(), "pieces come in order, contiguous");
                        data.extend_from_slice(p.data());
                    }
                    pieces.push((p.offset as usize, p.len as usize));
                }
                TaskEvent::Done(r) => {
                    if r.data_len > 0 {
                        assert_eq!(r.data_offset, data.len(), "pieces come in order, contiguous");
                        data.extend_from_slice(r.data());
                    }
                    return (pieces, r);
                }
                other => panic!("a streamed read reports pieces and its end only: {other:?}"),
            }
        }
    }
    panic!("task {tag} never completed");
}

#[test]
fn a_large_read_streams_in_order_with_the_status_on_the_last_piece() {
    let mut e = env();
    let a = e.a.clone();
    let want = pattern(600 * BS);
    assert_eq!(e.write16(&a, 100, want.clone()).status, Status::Good);
    e.dc.set_stream_chunk(Some(CHUNK));
    // The whole transfer: 300 KiB in pieces of 64 KiB, the last one 44 KiB.
    let t = e.task(&a, &rw16(op::READ16, 100, 600, 0), 600 * BS as u32, None);
    let tag = t.tag;
    e.ch().submit(t);
    let mut got = Vec::new();
    let (pieces, last) = collect(e.ch(), tag, &mut got);
    assert_eq!(pieces, vec![(0, CHUNK), (CHUNK, CHUNK), (2 * CHUNK, CHUNK), (3 * CHUNK, CHUNK)]);
    assert_eq!((last.status, last.data_offset, last.data_len, last.residual), (Status::Good, 4 * CHUNK, 600 * BS - 4 * CHUNK, Residual::None));
    assert!(got == want, "the streamed data is what was written");

    // EDTL shorter than the transfer (not a whole block): only EDTL bytes, the rest residual.
    let edtl = 200 * BS as u32 + 100;
    let t = e.task(&a, &rw16(op::READ16, 100, 600, 0), edtl, None);
    let tag = t.tag;
    e.ch().submit(t);
    let mut got = Vec::new();
    let (pieces, last) = collect(e.ch(), tag, &mut got);
    assert_eq!(pieces.len(), 1);
    assert_eq!(last.residual, Residual::Overflow(600 * BS as u32 - edtl));
    assert_eq!(got.len(), edtl as usize);
    assert!(got[..] == want[..edtl as usize]);

    // A read of one piece or less is not streamed: one buffer, as before.
    let t = e.task(&a, &rw16(op::READ16, 100, (CHUNK / BS) as u32, 0), CHUNK as u32, None);
    let tag = t.tag;
    e.ch().submit(t);
    let mut got = Vec::new();
    let (pieces, last) = collect(e.ch(), tag, &mut got);
    assert!(pieces.is_empty());
    assert_eq!((last.data_offset, last.data_len), (0, CHUNK));
}

/// A 16 MiB READ completes with 1 MiB of budget left: it holds at most its window of
/// pieces, each given back once the caller is done with it.
#[test]
fn a_streamed_read_needs_only_its_window_of_memory() {
    let lun = malloc_lun(LunConfig::default(), 65536);
    let pool: &'static riser_buf::Pool = Box::leak(Box::new(riser_buf::Pool::new(riser_buf::MIN_MAX_BYTES)));
    let hog = pool.try_alloc(riser_buf::MIN_MAX_BYTES - (1 << 20), &mut None).expect("most of the budget");
    let mut ch = LunChannel::new(lun);
    ch.set_pool(pool);
    ch.set_stream_chunk(Some(256 * 1024));
    let n = Arc::new(Nexus::new("iqn.2024-01.test:stream", 1, "iqn.2024-01.test:tgt", 1));
    let mut out = Vec::new();
    ch.submit(ScsiTask::new(1, 0, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, &n)); // power-on UA
    while out.is_empty() {
        ch.poll(&mut out);
    }
    let blocks = (16 << 20) / BS as u32;
    let mut t = ScsiTask::new(2, 0, &rw16(op::READ16, 0, blocks, 0), 16 << 20, &n);
    t.read = true;
    ch.submit(t);
    let mut got = Vec::new();
    let (pieces, last) = collect(&mut ch, 2, &mut got);
    assert_eq!(last.status, Status::Good);
    assert_eq!(pieces.len(), 63);
    assert_eq!(got.len(), 16 << 20);
    drop(hog);
}

/// An abort in mid-stream: the task ends aborted, no piece comes after its result, and the
/// channel serves the next read.
#[test]
fn an_aborted_streamed_read_ends_quietly() {
    let mut e = env();
    let a = e.a.clone();
    e.dc.set_stream_chunk(Some(CHUNK));
    let t = e.task(&a, &rw16(op::READ16, 0, 4096, 0), 4096 * BS as u32, None);
    let tag = t.tag;
    e.ch().submit(t);
    let mut out = Vec::new();
    e.ch().poll(&mut out);
    assert!(e.ch().abort_task(&a, tag));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut ended = false;
    while std::time::Instant::now() < deadline && e.ch().busy() {
        e.ch().poll(&mut out);
    }
    for r in out.drain(..) {
        assert!(!ended, "nothing after the task's result");
        if r.ends_task() {
            assert!(r.is_aborted());
            ended = true;
        }
    }
    assert!(ended);
    assert_eq!(e.read16(&a, 0, 8).len(), 8 * BS);
}

/// Feeds a streamed write's wants from `data` until it ends; returns the result and the
/// wants seen.
fn feed(e: &mut Env, tag: u64, data: &[u8]) -> (ScsiResult, Vec<(u32, u32)>) {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        e.dc.poll(&mut out);
        // Each piece served at once, before the writes in flight complete (as a fast
        // initiator and a slow device do): the next want may come while one is written.
        loop {
            if out.is_empty() {
                break;
            }
            for ev in out.drain(..) {
                let w = match ev {
                    TaskEvent::Want(w) => w,
                    TaskEvent::Done(r) => {
                        assert_eq!(r.tag, tag);
                        return (r, seen);
                    }
                    other => panic!("a streamed write reports wants and its end only: {other:?}"),
                };
                assert_eq!((w.tag, w.lun), (tag, e.lun.id()));
                seen.push((w.offset, w.len));
                let (o, n) = (w.offset as usize, w.len as usize);
                e.dc.write_data(LunId::new(w.lun), tag, w.offset, IoBuf::from(data[o..o + n].to_vec()));
            }
            e.dc.take_events(&mut out);
        }
    }
    panic!("task {tag} never completed");
}

#[test]
fn a_streamed_write_asks_for_its_data_piece_by_piece() {
    let mut e = env();
    let a = e.a.clone();
    e.dc.set_stream_chunk(Some(CHUNK));
    let data = pattern(600 * BS);
    let mut t = e.task(&a, &rw16(op::WRITE16, 50, 600, 0), 600 * BS as u32, None);
    t.write = true;
    t.data_out = DataOut::Streamed;
    let tag = t.tag;
    e.dc.submit(t);
    let (r, seen) = feed(&mut e, tag, &data);
    assert_eq!(r.status, Status::Good, "{r:?}");
    let c = CHUNK as u32;
    assert_eq!(seen, vec![(0, c), (c, c), (2 * c, c), (3 * c, c), (4 * c, 600 * BS as u32 - 4 * c)]);
    e.dc.set_stream_chunk(None);
    assert!(e.read16(&a, 50, 600) == data, "what was written is what was sent");
    e.dc.set_stream_chunk(Some(CHUNK));

    // A WRITE that fails its checks asks for nothing: out of range.
    let mut t = e.task(&a, &rw16(op::WRITE16, BLOCKS - 10, 600, 0), 600 * BS as u32, None);
    t.write = true;
    t.data_out = DataOut::Streamed;
    let tag = t.tag;
    e.dc.submit(t);
    let (r, seen) = feed(&mut e, tag, &data);
    assert_eq!((r.status, r.sense_triplet()), (Status::CheckCondition, Some((5, 0x21, 0))));
    assert!(seen.is_empty());
}

#[test]
fn a_streamed_write_waiting_for_data_keeps_no_reactor_busy_and_aborts_cleanly() {
    let mut e = env();
    let a = e.a.clone();
    e.dc.set_stream_chunk(Some(CHUNK));
    let mut t = e.task(&a, &rw16(op::WRITE16, 0, 600, 0), 600 * BS as u32, None);
    t.write = true;
    t.data_out = DataOut::Streamed;
    let tag = t.tag;
    e.dc.submit(t);
    let mut out = Vec::new();
    e.dc.poll(&mut out);
    let wants: Vec<_> = out.drain(..).filter(|ev| matches!(ev, TaskEvent::Want(_))).collect();
    assert_eq!(wants.len(), 1);
    assert!(!e.ch().busy(), "waiting for the initiator's data is not work");
    assert!(e.ch().abort_task(&a, tag));
    e.dc.poll(&mut out);
    assert!(matches!(out.as_slice(), [r] if r.tag() == tag && r.is_aborted()));
    // Data after the abort is dropped; the LUN serves on.
    e.dc.write_data(LunId::new(e.lun.id()), tag, 0, IoBuf::from(vec![0u8; CHUNK]));
    assert_eq!(e.read16(&a, 0, 8).len(), 8 * BS);

    // Data nobody asked for (a later piece) fails the command instead of leaving it waiting
    // for the piece it needs.
    let mut t = e.task(&a, &rw16(op::WRITE16, 0, 600, 0), 600 * BS as u32, None);
    t.write = true;
    t.data_out = DataOut::Streamed;
    let tag = t.tag;
    e.dc.submit(t);
    e.dc.poll(&mut out);
    e.dc.write_data(LunId::new(e.lun.id()), tag, CHUNK as u32, IoBuf::from(vec![0u8; CHUNK]));
    out.clear();
    e.dc.poll(&mut out);
    assert!(matches!(out.as_slice(), [TaskEvent::Done(r)] if r.tag == tag && r.status == Status::CheckCondition), "{out:?}");
}

/// A want still waiting for `poll` when its write ends goes with it: the abort is the task's
/// last event, and its only one after the abort.
#[test]
fn a_want_queued_when_its_write_ends_is_withdrawn() {
    let mut e = env();
    let a = e.a.clone();
    e.dc.set_stream_chunk(Some(CHUNK));
    let mut t = e.task(&a, &rw16(op::WRITE16, 0, 600, 0), 600 * BS as u32, None);
    t.write = true;
    t.data_out = DataOut::Streamed;
    let tag = t.tag;
    e.dc.submit(t);
    let mut out = Vec::new();
    e.dc.poll(&mut out);
    assert!(matches!(out.as_slice(), [TaskEvent::Want(w)] if w.offset == 0), "{out:?}");
    out.clear();
    // The first piece is written while the second is asked for; the task is aborted before
    // that want is taken.
    e.dc.write_data(LunId::new(e.lun.id()), tag, 0, IoBuf::from(vec![0u8; CHUNK]));
    assert!(e.ch().abort_task(&a, tag));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline && e.ch().busy() {
        e.dc.poll(&mut out);
    }
    assert!(matches!(out.as_slice(), [r] if r.tag() == tag && r.is_aborted()), "{out:?}");
}
