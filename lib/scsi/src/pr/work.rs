//! The bounded pool PERSISTENT RESERVE OUT work runs on, off the reactors: the APTPL file's
//! write (write, fsync, rename, fsync of the directory) and every change of a device's
//! shared state (reads, compare-and-swap writes and notifies over the network). A reactor
//! never waits for either; the executor polls the command's [`Deferred`] result. The
//! announcements of resets to other gateways (`lu_events`) run on a pool of their own of
//! the same kind, so that PR work never stands in their way.
//!
//! * **A fixed number of threads** ([`WORKERS`]), started at the first use and kept: a
//!   flood of PR OUTs costs no more threads than one.
//! * **A bounded backlog per LUN** ([`PER_LUN`] tasks of one LUN submitted and not started
//!   yet): past it, that LUN's command is answered BUSY at once (SAM-5 5.3.1: the logical
//!   unit cannot accept it now; the initiator retries later, and does not shrink its queue
//!   depth as TASK SET FULL would make it), never queued without bound. The bound is per
//!   LUN, not shared: an initiator that floods one LUN fills that LUN's queue only, and
//!   every other LUN's PR OUTs are still accepted. All together at most `PER_LUN` tasks
//!   per LUN wait, and LUNs are made by the operator, not by initiators.
//! * **One LUN's work runs in order, one task at a time** ([`Serial`]): the second of two
//!   PR OUTs sees, and makes durable, the state the first left. A LUN whose device is slow
//!   (a cluster that does not answer for 30 s) holds at most one worker (a serial is in
//!   the ready list, or on a worker, at most once); the others serve the other LUNs, each
//!   taking turns one task at a time.
//! * **No reactor waits on a lock held across I/O**: a [`Serial`]'s lock and the pool's
//!   are held only to queue and dequeue.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use crate::sense::{CmdError, CmdResult, Status};

/// Worker threads of the process's pool.
pub(crate) const WORKERS: usize = 4;
/// Tasks of one LUN submitted and not started yet before its next PR OUT is answered BUSY.
/// Per LUN so that one initiator flooding one LUN (a few sessions, each at full queue
/// depth) cannot make every other LUN's PR OUTs BUSY; 16 is far more than initiators keep
/// in flight on one LUN in practice (a PR OUT is rare: cluster fencing, a failover), and
/// small enough that the worst case, every LUN full, stays a few thousand small closures.
pub(crate) const PER_LUN: usize = 16;

pub(crate) type Task = Box<dyn FnOnce() + Send>;

/// Why a task was not queued.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// This LUN's backlog is at its bound.
    Full,
    /// No worker thread could be started.
    NoThread,
}

impl Refused {
    /// The command's answer: BUSY when the LUN's backlog is full (try again later), an internal
    /// error when there is no thread to run it at all.
    pub fn to_error(&self) -> CmdError {
        match self {
            Refused::Full => busy(),
            Refused::NoThread => CmdError::internal(),
        }
    }
}

/// BUSY (SAM-5 5.3.1): not accepted now, try again later.
pub(crate) fn busy() -> CmdError {
    CmdError { status: Status::Busy, sense: None }
}

/// The tasks of one LUN, run one at a time in submission order.
#[derive(Default)]
pub(crate) struct Serial {
    q: Mutex<SerialQ>,
}

#[derive(Default)]
pub(crate) struct SerialQ {
    tasks: VecDeque<Task>,
    /// Queued in the pool's ready list or being run by a worker.
    running: bool,
    /// Tasks refused for a full queue (so that the caller logs the first and then every
    /// 1000th only: a flood must not flood the log too).
    refused: u64,
}

impl SerialQ {
    /// Nothing queued and nothing running.
    pub fn idle(&self) -> bool {
        !self.running && self.tasks.is_empty()
    }

    /// Whether a refusal just returned is worth a log line: the first, then every 1000th.
    pub fn log_refusal(&self) -> bool {
        self.refused % 1000 == 1
    }

    /// Tasks refused so far for a full queue.
    pub fn refused(&self) -> u64 {
        self.refused
    }
}

impl Serial {
    /// Its queue; held only to look and to queue (never across a task).
    pub fn lock(&self) -> MutexGuard<'_, SerialQ> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a task is queued or running.
    #[cfg(test)]
    pub fn busy(&self) -> bool {
        !self.lock().idle()
    }
}

/// A fixed set of worker threads and a bounded backlog per [`Serial`].
pub(crate) struct Pool {
    name: &'static str,
    workers: usize,
    /// Tasks of one serial waiting at most.
    per_serial: usize,
    /// Serials with a task to run, in the order they became ready.
    ready: Mutex<VecDeque<Arc<Serial>>>,
    wake: Condvar,
    /// Tasks queued and not started, over every serial.
    queued: AtomicUsize,
    /// Threads started.
    threads: Mutex<usize>,
}

impl Pool {
    /// `workers` threads; at most `per_serial` tasks of one serial wait.
    pub fn new(name: &'static str, workers: usize, per_serial: usize) -> Arc<Pool> {
        Arc::new(Pool {
            name,
            workers: workers.max(1),
            per_serial: per_serial.max(1),
            ready: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            queued: AtomicUsize::new(0),
            threads: Mutex::new(0),
        })
    }

    /// Tasks of one serial that may wait.
    pub fn per_serial(&self) -> usize {
        self.per_serial
    }

    /// Worker threads started so far (never more than `workers`).
    #[cfg(test)]
    pub fn threads(&self) -> usize {
        *self.threads.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tasks queued and not started.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Starts the workers at the first use (again later for any that could not start).
    /// Whether at least one runs.
    fn ensure_workers(self: &Arc<Self>) -> bool {
        let mut n = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        while *n < self.workers {
            let me = self.clone();
            let spawned = std::thread::Builder::new().name(format!("{}-{}", self.name, *n)).spawn(move || me.work());
            match spawned {
                Ok(_) => *n += 1,
                Err(e) => {
                    log::error!("cannot start {} worker thread {} of {}: {e}", self.name, *n + 1, self.workers);
                    break;
                }
            }
        }
        *n > 0
    }

    /// Queues `task` on `serial` (whose lock the caller holds as `q`): it runs after the
    /// serial's earlier tasks. Refused at once when the serial's backlog is full (other
    /// serials' backlogs do not count), then [`SerialQ::log_refusal`] says whether to log.
    pub fn submit(self: &Arc<Self>, serial: &Arc<Serial>, q: &mut SerialQ, task: Task) -> Result<(), Refused> {
        if !self.ensure_workers() {
            return Err(Refused::NoThread);
        }
        if q.tasks.len() >= self.per_serial {
            q.refused += 1;
            return Err(Refused::Full);
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        q.tasks.push_back(task);
        if !q.running {
            q.running = true;
            self.ready.lock().unwrap_or_else(|p| p.into_inner()).push_back(serial.clone());
            self.wake.notify_one();
        }
        Ok(())
    }

    /// A worker: takes the next ready serial, runs one of its tasks, puts it back at the
    /// end of the ready list if it has more.
    fn work(self: Arc<Self>) {
        loop {
            let serial = {
                let mut r = self.ready.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if let Some(s) = r.pop_front() {
                        break s;
                    }
                    r = self.wake.wait(r).unwrap_or_else(|p| p.into_inner());
                }
            };
            let task = serial.lock().tasks.pop_front();
            if let Some(task) = task {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                if std::panic::catch_unwind(AssertUnwindSafe(task)).is_err() {
                    log::error!("{}: a task panicked; its command fails", self.name);
                }
            }
            let mut q = serial.lock();
            if q.tasks.is_empty() {
                q.running = false;
            } else {
                self.ready.lock().unwrap_or_else(|p| p.into_inner()).push_back(serial.clone());
                self.wake.notify_one();
            }
        }
    }
}

/// The process's pool for PERSISTENT RESERVE OUT work ([`WORKERS`] threads, [`PER_LUN`]
/// tasks of one LUN waiting at most).
pub(crate) fn pool() -> Arc<Pool> {
    #[cfg(test)]
    if let Some(p) = tests::OVERRIDE.with(|o| o.borrow().clone()) {
        return p;
    }
    static POOL: OnceLock<Arc<Pool>> = OnceLock::new();
    POOL.get_or_init(|| Pool::new("pr-work", WORKERS, PER_LUN)).clone()
}

/// The result of work running on a worker thread, polled by the executor.
#[derive(Default)]
pub(crate) struct Deferred {
    result: Mutex<Option<CmdResult<()>>>,
}

impl Deferred {
    fn set(&self, r: CmdResult<()>) {
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
    }

    /// The result once the worker is done (once).
    pub fn take(&self) -> Option<CmdResult<()>> {
        self.result.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// A new result and the worker's end of it.
    pub fn new() -> (Arc<Deferred>, Completer) {
        let d = Arc::new(Deferred::default());
        (d.clone(), Completer(Some(d)))
    }
}

/// Sets a [`Deferred`]; dropped without [`Completer::finish`] (the task panicked, or was
/// never queued) it sets an internal error, so the command never waits forever.
pub(crate) struct Completer(Option<Arc<Deferred>>);

impl Completer {
    pub fn finish(mut self, r: CmdResult<()>) {
        if let Some(d) = self.0.take() {
            d.set(r);
        }
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            d.set(Err(CmdError::internal()));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    thread_local! {
        /// The pool this thread's submissions go to instead of the process's.
        pub(crate) static OVERRIDE: RefCell<Option<Arc<Pool>>> = const { RefCell::new(None) };
    }

    /// Makes this thread's PR OUTs use `p` until the guard drops.
    pub(crate) struct UsePool;

    impl UsePool {
        pub fn new(p: &Arc<Pool>) -> UsePool {
            OVERRIDE.with(|o| *o.borrow_mut() = Some(p.clone()));
            UsePool
        }
    }

    impl Drop for UsePool {
        fn drop(&mut self) {
            OVERRIDE.with(|o| *o.borrow_mut() = None);
        }
    }

    fn submit(p: &Arc<Pool>, s: &Arc<Serial>, f: impl FnOnce() + Send + 'static) -> Result<(), Refused> {
        let mut q = s.lock();
        p.submit(s, &mut q, Box::new(f))
    }

    #[test]
    fn many_tasks_run_on_at_most_the_workers_and_each_serials_backlog_is_bounded() {
        let p = Pool::new("test-pool", 2, 3);
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate_rx));
        let (done_tx, done_rx) = mpsc::channel::<usize>();
        // 10 LUNs: one task each may run, 3 each wait, the others are refused.
        let serials: Vec<Arc<Serial>> = (0..10).map(|_| Arc::new(Serial::default())).collect();
        let mut accepted = 0;
        let mut refused = [0u64; 10];
        for i in 0..60 {
            let (g, d) = (gate.clone(), done_tx.clone());
            match submit(&p, &serials[i % 10], move || {
                let _ = g.lock().unwrap().recv_timeout(Duration::from_secs(10));
                let _ = d.send(i);
            }) {
                Ok(()) => accepted += 1,
                Err(e) => {
                    assert_eq!(e, Refused::Full);
                    assert_eq!(e.to_error().status, Status::Busy);
                    refused[i % 10] += 1;
                }
            }
        }
        // At most 2 started (holding the gate or waiting for it) and 3 waiting per LUN.
        assert!((30..=32).contains(&accepted), "accepted {accepted}");
        for (s, r) in serials.iter().zip(refused) {
            assert!((2..=3).contains(&r), "refused {r} of one serial's 6");
            assert_eq!(s.lock().refused(), r);
            assert_eq!(s.lock().log_refusal(), r == 1);
        }
        assert!(p.queued() <= 30);
        assert_eq!(p.threads(), 2, "never more threads than workers");
        for _ in 0..accepted {
            gate_tx.send(()).unwrap();
        }
        let mut ran: Vec<usize> = (0..accepted).map(|_| done_rx.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        ran.sort_unstable();
        assert_eq!(ran.len(), accepted);
        assert_eq!(p.queued(), 0);
        // Drained: the pool takes work again, on the same threads.
        let (tx, rx) = mpsc::channel();
        submit(&p, &serials[0], move || tx.send(()).unwrap()).unwrap();
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(p.threads(), 2);
    }

    #[test]
    fn one_serial_runs_in_order_one_at_a_time() {
        let p = Pool::new("test-pool", 4, 64);
        let s = Arc::new(Serial::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        let inside = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        for i in 0..32 {
            let (log, inside, tx) = (log.clone(), inside.clone(), tx.clone());
            submit(&p, &s, move || {
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two tasks of one serial at once");
                std::thread::sleep(Duration::from_micros(200));
                log.lock().unwrap().push(i);
                inside.fetch_sub(1, Ordering::SeqCst);
                tx.send(()).unwrap();
            })
            .unwrap();
        }
        for _ in 0..32 {
            rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        assert_eq!(*log.lock().unwrap(), (0..32).collect::<Vec<_>>());
        // The serial goes idle once drained.
        let t0 = std::time::Instant::now();
        while s.busy() {
            assert!(t0.elapsed() < Duration::from_secs(10));
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_panicking_task_fails_its_command_and_the_worker_goes_on() {
        let p = Pool::new("test-pool", 1, 4);
        let s = Arc::new(Serial::default());
        let (d, c) = Deferred::new();
        submit(&p, &s, move || {
            let _c = c;
            panic!("test panic");
        })
        .unwrap();
        let (d2, c2) = Deferred::new();
        submit(&p, &s, move || c2.finish(Ok(()))).unwrap();
        let t0 = std::time::Instant::now();
        while d2.take().is_none() {
            assert!(t0.elapsed() < Duration::from_secs(10));
            std::thread::yield_now();
        }
        assert_eq!(d.take(), Some(Err(CmdError::internal())));
        assert_eq!(p.threads(), 1);
    }
}
