//! The preprocessing pool: a fixed set of threads that parse, render and tokenize large prompts
//! off the async I/O threads, at a lower CPU priority than the rest of the process. A stream of
//! 66 k-token requests then takes only the CPU the short requests leave: under contention the
//! kernel runs the I/O threads (which serve the short requests) first, instead of sharing the
//! cores fairly between them and the pool.
//!
//! Jobs wait in a bounded queue; a full queue makes the caller wait (backpressure rather than
//! unbounded buffering). Threads that code on a pool thread starts inherit the lower priority:
//! the pool's `on_start` work, run before [`PreprocessPool::new`] returns, is where the tokenizer
//! engine's own helper threads are made (the `fastokens` fan-out threads, which would otherwise
//! be made at normal priority by the first encode, the model's load-time self-check).

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{mpsc, oneshot};

/// How much lower than the process the pool's threads run (added to their nice value, which
/// stops at 19). At 19 CFS gives a busy pool thread about 1.5 % of what a busy I/O thread gets
/// when they compete, so large prompts run on what the rest of the process leaves (at 10, a
/// tenth, short requests beside a stream of 66 k-token prompts were served about 15 % slower:
/// docs/benchmarks.md, "Long prompts", sixth round).
pub const NICE_INCREMENT: i32 = 19;

/// Jobs that may wait per pool thread before callers wait to queue.
const QUEUED_PER_THREAD: usize = 4;

type Job = Box<dyn FnOnce() + Send>;

/// The pool (see the module docs). Dropping it lets its threads finish the queued jobs and exit.
pub struct PreprocessPool {
    jobs: mpsc::Sender<Job>,
    threads: usize,
}

/// The pool's threads have exited.
#[derive(Debug, thiserror::Error)]
#[error("preprocessing pool stopped")]
pub struct PoolStopped;

impl PreprocessPool {
    /// Starts `threads` threads (at least one) at [`NICE_INCREMENT`] below the caller's priority,
    /// and runs `on_start` on the first of them, at that priority, before returning.
    pub fn new(threads: usize, on_start: impl FnOnce() + Send + 'static) -> std::io::Result<Self> {
        let threads = threads.max(1);
        let (jobs, queue) = mpsc::channel::<Job>(threads * QUEUED_PER_THREAD);
        let queue = Arc::new(Mutex::new(queue));
        let (started, wait_started) = std::sync::mpsc::channel::<()>();
        let mut on_start: Option<Job> = Some(Box::new(on_start));
        for index in 0..threads {
            let queue = queue.clone();
            let first = on_start.take().map(|work| (work, started.clone()));
            std::thread::Builder::new()
                .name(format!("kvmesh-preprocess-{index}"))
                .spawn(move || {
                    lower_priority();
                    if let Some((work, started)) = first {
                        // A panic in it ends only `on_start`: the thread goes on to serve jobs.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
                        let _ = started.send(());
                    }
                    loop {
                        let job = queue
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .blocking_recv();
                        match job {
                            Some(job) => job(),
                            None => return,
                        }
                    }
                })?;
        }
        drop(started);
        let _ = wait_started.recv();
        Ok(Self { jobs, threads })
    }

    /// Threads of the pool.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `work` on a pool thread and waits for its result. A panic in `work` ends only this
    /// call (the result is lost, the thread goes on).
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PoolStopped> {
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            if let Ok(value) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
                let _ = done.send(value);
            }
        });
        self.jobs.send(job).await.map_err(|_| PoolStopped)?;
        result.await.map_err(|_| PoolStopped)
    }
}

/// Raises the calling thread's nice value by [`NICE_INCREMENT`]. Raising needs no privilege; if
/// the system refuses anyway the pool runs at normal priority, which is only slower for others.
fn lower_priority() {
    let thread = rustix::thread::gettid();
    let current = rustix::process::getpriority_process(Some(thread)).unwrap_or(0);
    if let Err(error) = rustix::process::setpriority_process(Some(thread), current + NICE_INCREMENT)
    {
        tracing::debug!(%error, "preprocessing thread keeps normal priority");
    }
}

/// The nice value of the calling thread (for tests).
pub fn current_nice() -> i32 {
    rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_lower_priority_threads_and_a_panic_ends_only_its_call() {
        let (started_at, nice_at_start) = std::sync::mpsc::channel();
        let pool = PreprocessPool::new(2, move || {
            let _ = started_at.send(current_nice());
        })
        .unwrap();
        let here = current_nice();
        // `on_start` ran on a pool thread, at the pool's priority, before `new` returned.
        assert_eq!(
            nice_at_start.try_recv(),
            Ok((here + NICE_INCREMENT).min(19))
        );
        let there = pool.run(current_nice).await.unwrap();
        assert_eq!(there, (here + NICE_INCREMENT).min(19));
        let name = pool
            .run(|| std::thread::current().name().map(str::to_string))
            .await
            .unwrap();
        assert!(name.unwrap().starts_with("kvmesh-preprocess-"));
        assert!(pool.run(|| -> u32 { panic!("boom") }).await.is_err());
        // A panicking `on_start` leaves its thread serving jobs: one thread, still working.
        let lone = PreprocessPool::new(1, || panic!("start")).unwrap();
        assert_eq!(lone.run(|| 7).await.unwrap(), 7);
        let sums = futures::future::join_all((0..20u64).map(|n| pool.run(move || n * 2))).await;
        let total: u64 = sums.into_iter().map(Result::unwrap).sum();
        assert_eq!(total, 380);
    }
}
