//! What the router knows about a worker: its discovery record, its advertised runtime config and
//! the load it publishes.
//!
//! Plain structs rather than the protobuf types so the routing core stays free of gRPC and can be
//! driven by the simulator; the service layer converts `kvmesh.v1` messages field for field.

use kvmesh_kv::WorkerKey;

/// A worker's advertised capacity and data-parallel layout (`ModelRuntimeConfig`;
/// docs/discovery.md, "Runtime config"). A worker without one is not a `kv` candidate yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuntimeConfig {
    /// KV blocks per data-parallel rank (decode busy check, approximate `lru`).
    pub total_kv_blocks: Option<u64>,
    /// Token budget of one scheduler pass (prefill busy check, queue threshold).
    pub max_num_batched_tokens: Option<u64>,
    /// First data-parallel rank served.
    pub data_parallel_start_rank: u32,
    /// Number of data-parallel ranks (0 is read as 1).
    pub data_parallel_size: u32,
}

/// Most data-parallel ranks one worker is taken to serve. Cards come from discovery, and every
/// rank costs a candidate per decision and state per rank; no engine runs more.
pub const MAX_DATA_PARALLEL_RANKS: u32 = 1024;

impl RuntimeConfig {
    /// The ranks this worker serves, `[start, start + size)` with the size clamped to
    /// `1..=MAX_DATA_PARALLEL_RANKS` (0 is read as 1).
    pub fn ranks(&self) -> std::ops::Range<u32> {
        let start = self.data_parallel_start_rank;
        start..start.saturating_add(self.data_parallel_size.clamp(1, MAX_DATA_PARALLEL_RANKS))
    }
}

/// A discovered, live worker instance of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// Discovery instance id (never reused).
    pub worker_id: u64,
    /// `device_type` of its instance record (`cuda`, `cpu`, …); `device-aware-weighted` splits on
    /// `cpu`.
    pub device_type: String,
    /// Advertised runtime config, once the card carries one.
    pub runtime: Option<RuntimeConfig>,
}

impl WorkerInfo {
    /// A worker on an accelerator with one rank and no advertised capacity.
    pub fn new(worker_id: u64) -> Self {
        Self {
            worker_id,
            device_type: "cuda".into(),
            runtime: Some(RuntimeConfig::default()),
        }
    }

    /// Sets the runtime config.
    pub fn with_runtime(mut self, runtime: RuntimeConfig) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Sets the device type.
    pub fn with_device_type(mut self, device_type: impl Into<String>) -> Self {
        self.device_type = device_type.into();
        self
    }

    /// Whether the worker is in the CPU group of `device-aware-weighted`.
    pub fn is_cpu(&self) -> bool {
        self.device_type.eq_ignore_ascii_case("cpu")
    }

    /// Ranks the worker serves (rank 0 alone without runtime config).
    pub fn ranks(&self) -> std::ops::Range<u32> {
        self.runtime.unwrap_or_default().ranks()
    }

    /// The rank requests are tracked under when none was chosen (non-kv modes).
    pub fn default_rank(&self) -> u32 {
        self.ranks().start
    }
}

/// Load one rank publishes on `kvmesh.{ns}.load.{model}` (`kvmesh.v1.WorkerLoad`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerLoad {
    /// The (worker, dp_rank).
    pub worker: WorkerKey,
    /// KV blocks referenced by running sequences.
    pub kv_used_blocks: u64,
    /// KV blocks of the rank in all (used when the runtime config has none).
    pub kv_total_blocks: u64,
    /// Sequences being prefilled or decoded.
    pub num_running: u32,
    /// Sequences waiting for admission.
    pub num_waiting: u32,
    /// Prompt tokens of waiting sequences not yet prefilled.
    pub waiting_prefill_tokens: u64,
}
