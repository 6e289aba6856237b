//! The allocator every kvmesh binary runs on. A request allocates hundreds of small, short-lived
//! blocks (strings, token vectors, futures, protobuf and JSON values); under glibc's allocator
//! `malloc`, `free` and their consolidation were about 30 % of the instructions of a short
//! request (callgrind, docs/benchmarks.md), and mimalloc's thread-local free lists take most of
//! that away. Declared per binary with [`global_allocator!`](crate::global_allocator), never in a
//! library, so tests and fuzz targets keep the system allocator.

/// The allocator type the binaries install.
pub use mimalloc::MiMalloc;

/// Installs [`MiMalloc`] as the process's global allocator: one line at the top of each
/// binary's `main.rs`, so the choice is made here once.
#[macro_export]
macro_rules! global_allocator {
    () => {
        #[global_allocator]
        static GLOBAL_ALLOCATOR: $crate::allocator::MiMalloc = $crate::allocator::MiMalloc;
    };
}
