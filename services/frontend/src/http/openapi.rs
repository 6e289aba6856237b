//! `GET /openapi.json` and `GET /docs`: the OpenAPI 3 description of the routes this frontend
//! serves, at the paths it serves them (route overrides applied, Anthropic and admin routes only
//! when on), with the request and response schemas derived from the types the handlers parse and
//! send; and Swagger UI over it from assets compiled into the binary (nothing is fetched).

use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem, PathItemBuilder};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ComponentsBuilder, ObjectBuilder, Type};
use utoipa::openapi::{
    Content, InfoBuilder, OpenApi, OpenApiBuilder, PathsBuilder, Ref, RefOr, Required, Schema,
};
use utoipa::{PartialSchema, ToSchema};

use kvmesh_llm::anthropic::{CountTokensRequest, MessagesRequest};
use kvmesh_llm::openai::{
    ChatCompletionRequest, ChatCompletionResponse, CompletionRequest, CompletionResponse,
    EmbeddingsRequest, EmbeddingsResponse, ErrorResponse, ModelList,
};
use kvmesh_llm::responses::ResponsesRequest;

mod answers;

/// The paths the routes are served at, after the `DYN_HTTP_SVC_*` overrides.
pub struct RoutePaths {
    /// Chat completions.
    pub chat: String,
    /// Completions.
    pub completions: String,
    /// Embeddings.
    pub embeddings: String,
    /// Responses.
    pub responses: String,
    /// Anthropic Messages, when on.
    pub messages: Option<String>,
    /// The models list.
    pub models: String,
    /// Health.
    pub health: String,
    /// Liveness.
    pub live: String,
    /// Prometheus metrics.
    pub metrics: String,
    /// Whether `/busy_threshold` is served.
    pub admin: bool,
}

/// Statuses every inference route may answer with an error body.
const ERROR_STATUSES: [(&str, &str); 9] = [
    (
        "400",
        "Invalid request (bad JSON, a field out of range, the prompt too long)",
    ),
    (
        "401",
        "No API key or a wrong one (only with --http-api-keys-file)",
    ),
    ("404", "Unknown model"),
    ("413", "Body over DYN_HTTP_BODY_LIMIT_MB"),
    ("500", "Unclassified failure (no internals in the message)"),
    ("501", "A recognised feature this release does not support"),
    ("503", "No ready worker, draining, or a worker unavailable"),
    (
        "504",
        "The worker did not answer within DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS",
    ),
    (
        "529",
        "Every worker busy (the status is DYN_HTTP_OVERLOAD_STATUS_CODE)",
    ),
];

/// The OpenAPI document of a frontend serving `paths`.
pub fn document(paths: &RoutePaths) -> OpenApi {
    let mut routes = PathsBuilder::new()
        .path(
            &paths.chat,
            inference(
                "createChatCompletion",
                "Chat completion, unary or streamed as server-sent events",
                "ChatCompletionRequest",
                "ChatCompletionResponse",
                "ErrorResponse",
            ),
        )
        .path(
            &paths.completions,
            inference(
                "createCompletion",
                "Text completion, unary or streamed as server-sent events",
                "CompletionRequest",
                "CompletionResponse",
                "ErrorResponse",
            ),
        )
        .path(
            &paths.embeddings,
            inference(
                "createEmbedding",
                "Embeddings of strings or token ids",
                "EmbeddingsRequest",
                "EmbeddingsResponse",
                "ErrorResponse",
            ),
        )
        .path(
            &paths.responses,
            inference(
                "createResponse",
                "OpenAI Responses API (stateless), unary or streamed as numbered events",
                "ResponsesRequest",
                "ResponseObject",
                "ErrorResponse",
            ),
        )
        .path(
            &paths.models,
            get("listModels", "Ready models", json_schema("ModelList")),
        )
        .path(
            &paths.health,
            get(
                "health",
                "200 with at least one ready model, else 503",
                any_object(),
            )
            .merge_status("503", "No ready model, or draining"),
        )
        .path(
            &paths.live,
            get("live", "200 while the process runs", any_object()),
        )
        .path(&paths.metrics, metrics_item());
    if let Some(messages) = &paths.messages {
        routes = routes
            .path(
                messages,
                inference(
                    "createMessage",
                    "Anthropic Messages, unary or streamed as named events",
                    "MessagesRequest",
                    "MessageObject",
                    "AnthropicError",
                ),
            )
            .path(
                format!("{}/count_tokens", messages.trim_end_matches('/')),
                inference(
                    "countMessageTokens",
                    "Tokens of a Messages request's rendered prompt",
                    "CountTokensRequest",
                    "CountTokensResponse",
                    "AnthropicError",
                ),
            );
    }
    if paths.admin {
        routes = routes.path("/busy_threshold", busy_threshold_item());
    }
    let mut components = ComponentsBuilder::new()
        .schema("AnthropicError", anthropic_error())
        .schema("ResponseObject", answers::response_object())
        .schema("MessageObject", answers::message_object())
        .schema("CountTokensResponse", answers::token_count())
        .build();
    register::<ChatCompletionRequest>(&mut components);
    register::<ChatCompletionResponse>(&mut components);
    register::<CompletionRequest>(&mut components);
    register::<CompletionResponse>(&mut components);
    register::<EmbeddingsRequest>(&mut components);
    register::<EmbeddingsResponse>(&mut components);
    register::<ResponsesRequest>(&mut components);
    register::<MessagesRequest>(&mut components);
    register::<CountTokensRequest>(&mut components);
    register::<ModelList>(&mut components);
    register::<ErrorResponse>(&mut components);
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("kvmesh frontend")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "OpenAI- and Anthropic-compatible HTTP edge of kvmesh, a KV-cache-aware serving mesh",
                ))
                .build(),
        )
        .paths(routes.build())
        .components(Some(components))
        .build()
}

/// Adds `T`'s schema and every schema it refers to.
fn register<T: ToSchema>(components: &mut utoipa::openapi::Components) {
    components
        .schemas
        .insert(T::name().into_owned(), <T as PartialSchema>::schema());
    let mut nested = Vec::new();
    T::schemas(&mut nested);
    components.schemas.extend(nested);
}

fn json_schema(name: &str) -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(name))
}

fn any_object() -> RefOr<Schema> {
    ObjectBuilder::new().schema_type(Type::Object).into()
}

fn text() -> RefOr<Schema> {
    ObjectBuilder::new().schema_type(Type::String).into()
}

fn anthropic_error() -> RefOr<Schema> {
    let detail = ObjectBuilder::new()
        .property("type", ObjectBuilder::new().schema_type(Type::String))
        .property("message", ObjectBuilder::new().schema_type(Type::String))
        .required("type")
        .required("message");
    ObjectBuilder::new()
        .property(
            "type",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(["error"])),
        )
        .property("error", detail)
        .required("type")
        .required("error")
        .into()
}

/// A POST inference route: its JSON body, its 200 (the `unary` schema as JSON, or an event
/// stream) and its error statuses with `error` bodies.
fn inference(id: &str, summary: &str, request: &str, unary: &str, error: &str) -> PathItem {
    let ok = ResponseBuilder::new()
        .description("The answer; `stream: true` gets server-sent events")
        .content("application/json", Content::new(Some(json_schema(unary))))
        .content("text/event-stream", Content::new(Some(text())))
        .build();
    let mut operation = OperationBuilder::new()
        .operation_id(Some(id))
        .summary(Some(summary))
        .request_body(Some(
            RequestBodyBuilder::new()
                .content("application/json", Content::new(Some(json_schema(request))))
                .required(Some(Required::True))
                .build(),
        ))
        .response("200", ok);
    for (status, description) in ERROR_STATUSES {
        operation = operation.response(
            status,
            ResponseBuilder::new()
                .description(description)
                .content("application/json", Content::new(Some(json_schema(error))))
                .build(),
        );
    }
    PathItem::new(HttpMethod::Post, operation.build())
}

/// Extends a GET item with one more documented status.
trait MergeStatus {
    fn merge_status(self, status: &str, description: &str) -> Self;
}

impl MergeStatus for PathItem {
    fn merge_status(mut self, status: &str, description: &str) -> Self {
        if let Some(operation) = self.get.as_mut() {
            operation.responses.responses.insert(
                status.to_string(),
                RefOr::T(
                    ResponseBuilder::new()
                        .description(description)
                        .content("application/json", Content::new(Some(any_object())))
                        .build(),
                ),
            );
        }
        self
    }
}

fn get(id: &str, description: &str, body: RefOr<Schema>) -> PathItem {
    PathItem::new(
        HttpMethod::Get,
        OperationBuilder::new()
            .operation_id(Some(id))
            .summary(Some(description))
            .response(
                "200",
                ResponseBuilder::new()
                    .description(description)
                    .content("application/json", Content::new(Some(body)))
                    .build(),
            )
            .build(),
    )
}

fn metrics_item() -> PathItem {
    PathItem::new(
        HttpMethod::Get,
        OperationBuilder::new()
            .operation_id(Some("metrics"))
            .summary(Some("Prometheus metrics"))
            .response(
                "200",
                ResponseBuilder::new()
                    .description("Prometheus text exposition")
                    .content("text/plain", Content::new(Some(text())))
                    .build(),
            )
            .build(),
    )
}

/// `/busy_threshold`'s 401.
const ADMIN_KEY_STATUS: &str = "No admin key or a wrong one (only with --http-admin-keys-file)";

fn busy_threshold_item() -> PathItem {
    let thresholds = ObjectBuilder::new()
        .property("model", ObjectBuilder::new().schema_type(Type::String))
        .property(
            "active_decode_blocks_threshold",
            ObjectBuilder::new().schema_type(Type::Number),
        )
        .property(
            "active_prefill_tokens_threshold",
            ObjectBuilder::new().schema_type(Type::Integer),
        )
        .property(
            "active_prefill_tokens_threshold_frac",
            ObjectBuilder::new().schema_type(Type::Number),
        )
        .required("model");
    let error = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                Content::new(Some(json_schema("ErrorResponse"))),
            )
            .build()
    };
    let errors = |operation: OperationBuilder| {
        operation
            .response("401", error(ADMIN_KEY_STATUS))
            .response(
                "415",
                error("The body is not sent as content-type application/json"),
            )
            .response(
                "400",
                ResponseBuilder::new()
                    .description("Invalid threshold")
                    .content(
                        "application/json",
                        Content::new(Some(json_schema("ErrorResponse"))),
                    )
                    .build(),
            )
            .response(
                "404",
                ResponseBuilder::new()
                    .description("Unknown model")
                    .content(
                        "application/json",
                        Content::new(Some(json_schema("ErrorResponse"))),
                    )
                    .build(),
            )
    };
    PathItemBuilder::new()
        .operation(
            HttpMethod::Get,
            get(
                "getBusyThresholds",
                "Each model's busy thresholds",
                any_object(),
            )
            .merge_status("401", ADMIN_KEY_STATUS)
            .get
            .unwrap_or_default(),
        )
        .operation(
            HttpMethod::Post,
            errors(
                OperationBuilder::new()
                    .operation_id(Some("setBusyThreshold"))
                    .summary(Some("Change one model's busy thresholds"))
                    .request_body(Some(
                        RequestBodyBuilder::new()
                            .content("application/json", Content::new(Some(thresholds)))
                            .required(Some(Required::True))
                            .build(),
                    ))
                    .response(
                        "200",
                        ResponseBuilder::new()
                            .description("The model's thresholds after the change")
                            .content("application/json", Content::new(Some(any_object())))
                            .build(),
                    ),
            )
            .build(),
        )
        .build()
}
