//! Faults a test can switch on in a running mocker (`--fault-file`, docs/mocker.md, "Fault
//! injection"): the mesh's fault handling is tested on real processes, and a real engine cannot
//! be made to hang or fail on cue.

use std::path::PathBuf;

/// What the worker does with a new `Generate` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Serve it.
    None,
    /// Accept it and never answer (a stuck engine whose server still answers pings).
    Stall,
    /// Fail it at once with an internal error.
    Fail,
}

/// A file whose first word is read at every `Generate` call: `stall`, `fail`, or anything else
/// (a missing file included) for no fault.
#[derive(Debug, Clone)]
pub struct FaultFile(pub PathBuf);

impl FaultFile {
    /// The fault in force now.
    pub fn current(&self) -> Fault {
        let text = std::fs::read_to_string(&self.0).unwrap_or_default();
        match text.split_whitespace().next() {
            Some("stall") => Fault::Stall,
            Some("fail") => Fault::Fail,
            _ => Fault::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_says_which_fault() {
        let dir = std::env::temp_dir().join(format!("kvmesh-fault-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = FaultFile(dir.join("fault"));
        assert_eq!(file.current(), Fault::None, "a missing file is no fault");
        for (text, fault) in [
            ("stall\n", Fault::Stall),
            ("fail", Fault::Fail),
            ("", Fault::None),
            ("ok", Fault::None),
        ] {
            std::fs::write(&file.0, text).unwrap();
            assert_eq!(file.current(), fault, "{text:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
