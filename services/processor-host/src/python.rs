//! The embedded interpreter: starts CPython with the `kvmesh` package built into the binary, loads
//! the processor, and runs the host's asyncio loop on a thread of its own. Everything the Rust
//! side sends to Python goes through one feeder thread that hands the loop a batch at a time, so
//! no Tokio thread ever waits for the interpreter lock (docs/processors.md, "Threads").

use std::ffi::CString;
use std::sync::mpsc;

use kvmesh_proto::v1::ProcessStart;
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyDict, PyList, PyTuple};
use tokio::sync::mpsc::UnboundedSender;

/// The Python sources served as the `kvmesh` package (module name, is a package, source).
const SOURCES: &[(&str, bool, &str)] = &[
    ("kvmesh", true, include_str!("../python/kvmesh/__init__.py")),
    (
        "kvmesh.llm",
        true,
        include_str!("../python/kvmesh/llm/__init__.py"),
    ),
    (
        "kvmesh.llm.exceptions",
        false,
        include_str!("../python/kvmesh/llm/exceptions.py"),
    ),
    (
        "kvmesh.frontend",
        true,
        include_str!("../python/kvmesh/frontend/__init__.py"),
    ),
    (
        "kvmesh._host",
        false,
        include_str!("../python/kvmesh/_host.py"),
    ),
    (
        "kvmesh._routes",
        false,
        include_str!("../python/kvmesh/_routes.py"),
    ),
    (
        "kvmesh.stops",
        false,
        include_str!("../python/kvmesh/stops.py"),
    ),
    (
        "kvmesh._sglang",
        false,
        include_str!("../python/kvmesh/_sglang.py"),
    ),
];

const BOOTSTRAP: &str = include_str!("../python/bootstrap.py");

/// What a request's engine produced, in order.
#[derive(Debug, PartialEq)]
pub enum HostEvent {
    /// One chat-completion chunk (JSON).
    Chunk(String),
    /// Route and generate a preprocessed request (JSON).
    Generate {
        /// The call's id within the request.
        call_id: u64,
        /// The processor's request dict as JSON.
        json: String,
    },
    /// A response header set before the first chunk.
    Header {
        /// Header name.
        name: String,
        /// Header value.
        value: String,
    },
    /// The engine failed; nothing follows.
    Error {
        /// `ErrorCode` name, empty when `status` decides.
        code: String,
        /// An explicit HTTP status (`HttpError`), else 0.
        status: u32,
        /// The message.
        message: String,
    },
    /// Token counts of an `llm_metrics` annotation (JSON).
    Metrics(String),
    /// The engine finished; nothing follows.
    Done,
    /// The processor stopped a call (its context was stopped).
    CancelCall(u64),
}

/// A message for the Python side.
pub enum ToPython {
    /// A new request.
    Submit {
        /// The request's key in this host.
        key: u64,
        /// The request.
        start: ProcessStart,
        /// Where the engine's events go.
        events: UnboundedSender<HostEvent>,
    },
    /// One worker response (as the output dict's JSON) for a call.
    Output {
        /// The request's key.
        key: u64,
        /// The call.
        call_id: u64,
        /// The output dict as JSON.
        json: String,
    },
    /// A call failed with an `ErrorCode` name and a message.
    CallError {
        /// The request's key.
        key: u64,
        /// The call.
        call_id: u64,
        /// `ErrorCode` name.
        code: String,
        /// The message.
        message: String,
    },
    /// A call's stream ended.
    CallEnd {
        /// The request's key.
        key: u64,
        /// The call.
        call_id: u64,
    },
    /// The client went away.
    Cancel {
        /// The request's key.
        key: u64,
    },
    /// A token-input model's first worker registered or its card changed.
    ModelChanged {
        /// Served model name.
        model: String,
        /// The worker's instance id.
        instance_id: u64,
        /// The model card as protobuf JSON.
        card_json: String,
        /// The card's checksum.
        checksum: String,
    },
    /// A model's last worker left.
    ModelRemoved {
        /// Served model name.
        model: String,
    },
    /// One GET of a route extension.
    CallRoute {
        /// The route's path.
        path: String,
        /// The frontend's state for `FrontendExtensionContext`, as JSON.
        state_json: String,
        /// Gets the HTTP status and the JSON body.
        reply: tokio::sync::oneshot::Sender<(u16, String)>,
    },
}

/// What the host serves besides its chat processor: the route extensions
/// (`--frontend-route-extension`), the paths they must not take, and the status of a call that
/// finds every extension thread busy.
pub struct RouteSettings<'a> {
    /// Extension names (entry points or `module:function`).
    pub extensions: &'a [String],
    /// Paths the frontend serves itself.
    pub reserved: Vec<String>,
    /// `DYN_HTTP_OVERLOAD_STATUS_CODE`.
    pub overload_status: u16,
}

/// The running interpreter: send it work with [`PythonHost::send`].
#[derive(Clone)]
pub struct PythonHost {
    feeder: mpsc::Sender<ToPython>,
}

impl PythonHost {
    /// Starts CPython, loads the route extensions of `routes`, resolves `processor` and calls its
    /// provider with `config_json` (the resolved options) and `options_json`
    /// (`--dyn-chat-processor-config`); then runs the loop and the feeder on threads of their
    /// own. Returns the host and the extensions' paths; an error is the message to exit with.
    pub fn start(
        processor: &str,
        config_json: &str,
        options_json: &str,
        routes: &RouteSettings<'_>,
    ) -> Result<(Self, Vec<String>), String> {
        Python::initialize();
        let routes_json = serde_json::json!({
            "extensions": routes.extensions,
            "reserved": routes.reserved,
            "overload_status": routes.overload_status,
        })
        .to_string();
        let (host, paths) =
            Python::attach(|py| load(py, processor, config_json, options_json, &routes_json))?;
        let runner = Python::attach(|py| host.clone_ref(py));
        std::thread::Builder::new()
            .name("python-loop".into())
            .spawn(move || {
                Python::attach(|py| {
                    if let Err(error) = runner.bind(py).call_method0("run_forever") {
                        error.display(py);
                    }
                })
            })
            .map_err(|e| format!("start the Python thread: {e}"))?;
        let (feeder, inbox) = mpsc::channel();
        std::thread::Builder::new()
            .name("python-feeder".into())
            .spawn(move || feed(&host, &inbox))
            .map_err(|e| format!("start the Python feeder: {e}"))?;
        Ok((Self { feeder }, paths))
    }

    /// Queues `message` for the loop; false once the interpreter is gone.
    pub fn send(&self, message: ToPython) -> bool {
        self.feeder.send(message).is_ok()
    }
}

fn python_error(py: Python<'_>, error: &PyErr) -> String {
    let name = error
        .get_type(py)
        .name()
        .map(|name| name.to_string())
        .unwrap_or_default();
    if name == "StartupError" {
        return error.value(py).to_string();
    }
    error.display(py);
    format!("{name}: {}", error.value(py))
}

fn load(
    py: Python<'_>,
    processor: &str,
    config_json: &str,
    options_json: &str,
    routes_json: &str,
) -> Result<(Py<PyAny>, Vec<String>), String> {
    let run = || -> PyResult<(Py<PyAny>, Vec<String>)> {
        let sources = PyDict::new(py);
        for (name, is_package, source) in SOURCES {
            sources.set_item(name, (is_package, source))?;
        }
        let globals = PyDict::new(py);
        globals.set_item("SOURCES", sources)?;
        globals.set_item("__name__", "kvmesh_bootstrap")?;
        let code = CString::new(BOOTSTRAP)?;
        py.run(&code, Some(&globals), None)?;
        let module = py.import("kvmesh._host")?;
        let host =
            module
                .getattr("Host")?
                .call1((processor, config_json, options_json, routes_json))?;
        host.call_method0("start")?;
        let paths: Vec<String> = host.call_method0("route_paths")?.extract()?;
        Ok((host.unbind(), paths))
    };
    run().map_err(|error| python_error(py, &error))
}

/// Hands queued messages to the loop, as many as are waiting per wake-up.
fn feed(host: &Py<PyAny>, inbox: &mpsc::Receiver<ToPython>) {
    while let Ok(first) = inbox.recv() {
        let mut batch = vec![first];
        batch.extend(inbox.try_iter());
        Python::attach(|py| {
            let result = (|| -> PyResult<()> {
                let items = PyList::empty(py);
                for message in batch {
                    items.append(to_python(py, message)?)?;
                }
                host.bind(py).call_method1("dispatch", (items,))?;
                Ok(())
            })();
            if let Err(error) = result {
                error.display(py);
            }
        });
    }
}

fn to_python(py: Python<'_>, message: ToPython) -> PyResult<Bound<'_, PyTuple>> {
    Ok(match message {
        ToPython::Submit { key, start, events } => {
            let emit = emitter(py, events)?;
            (
                0u8,
                key,
                start.model,
                String::from_utf8_lossy(&start.request_json).into_owned(),
                start.headers_allowed,
                start.request_id,
                start.trace_id,
                start.span_id,
                start.parent_span_id,
                emit,
            )
                .into_pyobject(py)?
        }
        ToPython::Output { key, call_id, json } => {
            (1u8, key, call_id, 0u8, json, py.None()).into_pyobject(py)?
        }
        ToPython::CallError {
            key,
            call_id,
            code,
            message,
        } => (1u8, key, call_id, 1u8, code, message).into_pyobject(py)?,
        ToPython::CallEnd { key, call_id } => {
            (1u8, key, call_id, 2u8, py.None(), py.None()).into_pyobject(py)?
        }
        ToPython::Cancel { key } => (2u8, key).into_pyobject(py)?,
        ToPython::ModelChanged {
            model,
            instance_id,
            card_json,
            checksum,
        } => (3u8, model, instance_id, card_json, checksum).into_pyobject(py)?,
        ToPython::ModelRemoved { model } => (4u8, model).into_pyobject(py)?,
        ToPython::CallRoute {
            path,
            state_json,
            reply,
        } => (5u8, path, state_json, replier(py, reply)?).into_pyobject(py)?,
    })
}

/// A route call's `reply(status, body_json)`: the first call answers, later ones are dropped.
fn replier(
    py: Python<'_>,
    reply: tokio::sync::oneshot::Sender<(u16, String)>,
) -> PyResult<Bound<'_, PyCFunction>> {
    let reply = std::sync::Mutex::new(Some(reply));
    PyCFunction::new_closure(
        py,
        Some(c"reply"),
        None,
        move |args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>| -> PyResult<()> {
            let status: u16 = args.get_item(0)?.extract()?;
            let body: String = args.get_item(1)?.extract()?;
            let sender = reply
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(sender) = sender {
                let _ = sender.send((status, body));
            }
            Ok(())
        },
    )
}

/// The request's `emit(kind, a=None, b=None, c=None)`: each call becomes one [`HostEvent`].
fn emitter(py: Python<'_>, events: UnboundedSender<HostEvent>) -> PyResult<Bound<'_, PyCFunction>> {
    PyCFunction::new_closure(
        py,
        Some(c"emit"),
        None,
        move |args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>| -> PyResult<()> {
            let arg = |index: usize| args.get_item(index);
            let kind: u8 = arg(0)?.extract()?;
            let event = match kind {
                0 => HostEvent::Chunk(arg(1)?.extract()?),
                1 => HostEvent::Generate {
                    call_id: arg(1)?.extract()?,
                    json: arg(2)?.extract()?,
                },
                2 => HostEvent::Header {
                    name: arg(1)?.extract()?,
                    value: arg(2)?.extract()?,
                },
                3 => HostEvent::Error {
                    code: arg(1)?.extract()?,
                    status: arg(2)?.extract()?,
                    message: arg(3)?.extract()?,
                },
                4 => HostEvent::Metrics(arg(1)?.extract()?),
                5 => HostEvent::Done,
                6 => HostEvent::CancelCall(arg(1)?.extract()?),
                other => {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "unknown processor event kind {other}"
                    )));
                }
            };
            // A request whose stream is gone drops what its engine still sends.
            let _ = events.send(event);
            Ok(())
        },
    )
}
