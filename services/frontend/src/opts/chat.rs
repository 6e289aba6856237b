//! The frontend's chat-serving options: which API surfaces are on (Anthropic Messages), who
//! renders and parses chat (processors, route extensions), how reasoning and tools are presented,
//! the interactive REPL, and Dynamo's admission flags. Some are accepted before kvmesh implements
//! them (the `later` tier of docs/flags.md): [`ChatOpts::notices`] says for each what kvmesh does
//! instead, one WARN line each.

use clap::Args;
use kvmesh_core::flags::{negatable, parse_bool};

/// `--reasoning-field-name` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[clap(rename_all = "snake_case")]
pub enum ReasoningField {
    /// `reasoning_content`, vLLM's and DeepSeek's name.
    ReasoningContent,
    /// `reasoning`, OpenRouter's and newer vLLM's name.
    Reasoning,
}

/// Chat-serving options (see the module docs).
#[derive(Debug, Clone, Args)]
pub struct ChatOpts {
    /// Serve the Anthropic Messages API: `/v1/messages` and `/v1/messages/count_tokens`.
    #[arg(long, env = "DYN_ENABLE_ANTHROPIC_API", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub enable_anthropic_api: bool,
    /// Turn --enable-anthropic-api off.
    #[arg(long, overrides_with = "enable_anthropic_api")]
    pub no_enable_anthropic_api: bool,

    /// Strip Claude Code's billing attribution line (`x-anthropic-billing-header: ...`) from
    /// the Anthropic Messages system prompt, so that prompt caching is not broken by a line that
    /// changes per request.
    #[arg(long, env = "DYN_STRIP_ANTHROPIC_PREAMBLE", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub strip_anthropic_preamble: bool,
    /// Turn --strip-anthropic-preamble off.
    #[arg(long, overrides_with = "strip_anthropic_preamble")]
    pub no_strip_anthropic_preamble: bool,

    /// Emit each complete tool call as an `event: tool_call_dispatch` SSE event (accepted, not
    /// yet emitted).
    #[arg(long, env = "DYN_ENABLE_STREAMING_TOOL_DISPATCH", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub enable_streaming_tool_dispatch: bool,
    /// Turn --enable-streaming-tool-dispatch off.
    #[arg(long, overrides_with = "enable_streaming_tool_dispatch")]
    pub no_enable_streaming_tool_dispatch: bool,

    /// Emit the whole reasoning block as one `event: reasoning_dispatch` SSE event (accepted, not
    /// yet emitted).
    #[arg(long, env = "DYN_ENABLE_STREAMING_REASONING_DISPATCH", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub enable_streaming_reasoning_dispatch: bool,
    /// Turn --enable-streaming-reasoning-dispatch off.
    #[arg(long, overrides_with = "enable_streaming_reasoning_dispatch")]
    pub no_enable_streaming_reasoning_dispatch: bool,

    /// Response field that carries parsed reasoning.
    #[arg(
        long,
        env = "DYN_REASONING_FIELD_NAME",
        value_enum,
        default_value = "reasoning_content"
    )]
    pub reasoning_field_name: ReasoningField,

    /// Leave tool definitions out of the chat template when `tool_choice` is `none`.
    #[arg(long, env = "DYN_EXCLUDE_TOOLS_WHEN_TOOL_CHOICE_NONE", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub exclude_tools_when_tool_choice_none: bool,
    /// Turn --exclude-tools-when-tool-choice-none off.
    #[arg(long, overrides_with = "exclude_tools_when_tool_choice_none")]
    pub no_exclude_tools_when_tool_choice_none: bool,

    /// Chat pre/post processor: `dynamo` (built in), `vllm`, `sglang`, an entry point or
    /// `module:function`.
    #[arg(long, env = "DYN_CHAT_PROCESSOR", default_value = "dynamo", value_parser = non_empty)]
    pub dyn_chat_processor: String,

    /// JSON object passed to the chat processor as its options.
    #[arg(long, env = "DYN_CHAT_PROCESSOR_CONFIG", default_value = "{}", value_parser = json_object)]
    pub dyn_chat_processor_config: String,

    /// With a custom chat processor, start a `kvmesh-processor-host` child with this process's
    /// options (kvmesh addition); `false` uses only the hosts found in discovery.
    #[arg(long, env = "KVMESH_SPAWN_PROCESSOR_HOST", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub spawn_processor_host: bool,

    /// Port of a `kvmesh-processor-host`'s `/health`, `/live` and `/metrics` (kvmesh addition;
    /// unset: none). Read by the processor host only; the frontend serves these on its HTTP port.
    #[arg(long, env = "KVMESH_PROCESSOR_HOST_METRICS_PORT")]
    pub processor_host_metrics_port: Option<u16>,

    /// Trusted route extension: an entry point name or `module:function` (repeatable; the
    /// variable takes a whitespace-separated list).
    #[arg(
        long = "frontend-route-extension",
        env = "DYN_FRONTEND_ROUTE_EXTENSIONS",
        value_delimiter = ' '
    )]
    pub frontend_route_extensions: Vec<String>,

    /// Run custom tokenizer code shipped with a model (accepted; kvmesh loads `tokenizer.json`
    /// only, which runs no code).
    #[arg(long, env = "DYN_TRUST_REMOTE_CODE", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub trust_remote_code: bool,
    /// Turn --trust-remote-code off.
    #[arg(long, overrides_with = "trust_remote_code")]
    pub no_trust_remote_code: bool,

    /// Chat with the served model on stdin and stdout instead of serving HTTP.
    #[arg(short = 'i', long, env = "DYN_INTERACTIVE", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub interactive: bool,
    /// Turn --interactive off.
    #[arg(long, overrides_with = "interactive")]
    pub no_interactive: bool,

    /// Deprecated, ignored: admission is the busy thresholds and the router queue.
    #[arg(long, env = "DYN_ADMISSION_CONTROL", default_value = "none", value_parser = ["none", "token-capacity"])]
    pub admission_control: String,

    /// Deprecated, ignored: the serving topology follows the registered workers.
    #[arg(long, env = "DYN_ENFORCE_DISAGG", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub enforce_disagg: bool,
    /// Turn --enforce-disagg off.
    #[arg(long, overrides_with = "enforce_disagg")]
    pub no_enforce_disagg: bool,
}

impl ChatOpts {
    /// Whether `/v1/messages` is served.
    pub fn anthropic_api(&self) -> bool {
        negatable(self.enable_anthropic_api, self.no_enable_anthropic_api)
    }

    /// Whether Claude Code's billing line leaves the Messages system prompt.
    pub fn strip_anthropic_preamble(&self) -> bool {
        negatable(
            self.strip_anthropic_preamble,
            self.no_strip_anthropic_preamble,
        )
    }

    /// Whether tools leave the chat template when `tool_choice` is `none`.
    pub fn exclude_tools_when_tool_choice_none(&self) -> bool {
        negatable(
            self.exclude_tools_when_tool_choice_none,
            self.no_exclude_tools_when_tool_choice_none,
        )
    }

    /// The custom chat processor's name: `None` for the built-in `dynamo` preprocessing.
    pub fn custom_processor(&self) -> Option<&str> {
        (self.dyn_chat_processor != "dynamo").then_some(self.dyn_chat_processor.as_str())
    }

    /// Whether `--dyn-chat-processor-config` holds any option (the default `{}` holds none).
    fn has_processor_config(&self) -> bool {
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(
            &self.dyn_chat_processor_config,
        )
        .map_or(true, |options| !options.is_empty())
    }

    /// Whether `--interactive` is on.
    pub fn interactive(&self) -> bool {
        negatable(self.interactive, self.no_interactive)
    }

    /// One WARN line per option set that kvmesh does not act on (yet), saying what it does
    /// instead, and one per deprecated option set.
    pub fn notices(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let mut later = |flag: &str, instead: &str| {
            warnings.push(format!("{flag} is not implemented yet; kvmesh {instead}"));
        };
        if negatable(
            self.enable_streaming_tool_dispatch,
            self.no_enable_streaming_tool_dispatch,
        ) {
            later(
                "--enable-streaming-tool-dispatch",
                "sends no tool_call_dispatch events",
            );
        }
        if negatable(
            self.enable_streaming_reasoning_dispatch,
            self.no_enable_streaming_reasoning_dispatch,
        ) {
            later(
                "--enable-streaming-reasoning-dispatch",
                "sends no reasoning_dispatch events",
            );
        }
        if negatable(self.trust_remote_code, self.no_trust_remote_code) {
            later(
                "--trust-remote-code",
                "loads tokenizer.json with the Rust tokenizer, which runs no model code",
            );
        }
        if self.custom_processor().is_none() && self.has_processor_config() {
            warnings.push(
                "--dyn-chat-processor-config (DYN_CHAT_PROCESSOR_CONFIG) has no effect with the built-in dynamo chat processor; kvmesh passes it only to a custom --dyn-chat-processor".into(),
            );
        }
        if self.admission_control != "none" {
            warnings.push(
                "--admission-control is deprecated and ignored; admission is the busy thresholds and --router-queue-threshold".into(),
            );
        }
        if negatable(self.enforce_disagg, self.no_enforce_disagg) {
            warnings.push(
                "--enforce-disagg is deprecated and ignored; the topology follows the registered workers".into(),
            );
        }
        warnings
    }
}

fn non_empty(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(value.to_string())
    }
}

fn json_object(value: &str) -> Result<String, String> {
    match serde_json::from_str::<serde_json::Value>(value) {
        Ok(serde_json::Value::Object(_)) => Ok(value.to_string()),
        Ok(_) => Err("must be a JSON object".into()),
        Err(error) => Err(format!("not valid JSON: {error}")),
    }
}
