//! Grace periods for reusing memory that concurrent readers may still be looking at.
//!
//! Readers announce themselves in the counter of the current epoch for the duration of a query.
//! The writer retires freed nodes and member lists instead of reusing them at once; to recycle a
//! batch it advances the epoch and waits until the previous epoch's counter drains. Every reader
//! that could have seen the batch entered before the advance, so once the old counter is zero
//! none is left. Readers never wait; the writer waits at most for queries already running.
//!
//! One advance per recycle is enough because each one drains the counter it leaves behind: a
//! reader that registers under an epoch that has just ended sees the epoch change and moves on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long the writer spins on the draining counter before also yielding its time slice.
const SPIN: Duration = Duration::from_micros(20);

/// The epoch counter and its two reader counts.
#[derive(Debug, Default)]
pub(crate) struct Epochs {
    epoch: AtomicUsize,
    readers: [AtomicUsize; 2],
}

/// A reader's registration; leaving is dropping it.
pub(crate) struct ReadGuard<'a> {
    count: &'a AtomicUsize,
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Epochs {
    /// Registers a reader until the guard drops.
    pub(crate) fn enter(&self) -> ReadGuard<'_> {
        loop {
            let epoch = self.epoch.load(Ordering::SeqCst);
            let count = &self.readers[epoch & 1];
            count.fetch_add(1, Ordering::SeqCst);
            if self.epoch.load(Ordering::SeqCst) == epoch {
                return ReadGuard { count };
            }
            count.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Returns once every reader that entered before the call has left.
    pub(crate) fn synchronize(&self) {
        let epoch = self.epoch.load(Ordering::SeqCst);
        self.epoch.store(epoch.wrapping_add(1), Ordering::SeqCst);
        let count = &self.readers[epoch & 1];
        let start = Instant::now();
        while count.load(Ordering::SeqCst) != 0 {
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;

    #[test]
    fn synchronize_waits_for_running_readers() {
        let epochs = Arc::new(Epochs::default());
        let is_released = Arc::new(AtomicBool::new(false));
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let reader = {
            let epochs = Arc::clone(&epochs);
            let is_released = Arc::clone(&is_released);
            std::thread::spawn(move || {
                let _guard = epochs.enter();
                entered_tx.send(()).expect("main thread listens");
                while !is_released.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
            })
        };
        entered_rx.recv().expect("reader entered");
        let releaser = {
            let is_released = Arc::clone(&is_released);
            std::thread::spawn(move || {
                std::thread::yield_now();
                is_released.store(true, Ordering::SeqCst);
            })
        };
        epochs.synchronize();
        assert!(is_released.load(Ordering::SeqCst));
        reader.join().expect("reader");
        releaser.join().expect("releaser");
    }
}
