//! `inference.GRPCInferenceService` over the frontend's model table: health, metadata and config
//! answered from the table as discovery keeps it, inference through [`super::infer`]. With
//! `--http-api-keys-file` the two inference RPCs need a key in the `authorization` metadata; the
//! others stay open like `/health` and `/v1/models` on the HTTP edge. RPCs the
//! contract lists but kvmesh does not serve answer `UNIMPLEMENTED` (tonic's answer for a method
//! the service does not have).

use std::sync::Arc;

use kvmesh_proto::inference::grpc_inference_service_server::GrpcInferenceService;
use kvmesh_proto::inference::model_metadata_response::TensorMetadata;
use kvmesh_proto::inference::{
    DataType, ModelConfig, ModelConfigRequest, ModelConfigResponse, ModelInferRequest,
    ModelInferResponse, ModelInput, ModelMetadataRequest, ModelMetadataResponse, ModelOutput,
    ModelReadyRequest, ModelReadyResponse, ModelStreamInferResponse, ServerLiveRequest,
    ServerLiveResponse, ServerMetadataRequest, ServerMetadataResponse, ServerReadyRequest,
    ServerReadyResponse,
};
use kvmesh_runtime::otel::Trace;
use kvmesh_runtime::{ErrorCode, GrpcErrorCode as _};
use tonic::{Request, Response, Status, Streaming};

use super::infer::{self, INFER_ENDPOINT};
use super::tensors::{FINISH_REASON, TEXT_INPUT, TEXT_OUTPUT};
use crate::http::AppState;
use crate::models::ModelEntry;

/// The one model version kvmesh reports.
const MODEL_VERSION: &str = "1";
/// The platform and backend names of LLM models, as Dynamo reports them.
const PLATFORM: &str = "dynamo";

/// The KServe service of one frontend.
pub struct KserveService {
    state: Arc<AppState>,
    stream_concurrency: usize,
}

impl KserveService {
    /// A service over `state`'s models, running up to `stream_concurrency` requests per stream.
    pub fn new(state: Arc<AppState>, stream_concurrency: usize) -> Self {
        Self {
            state,
            stream_concurrency: stream_concurrency.max(1),
        }
    }

    /// The ready model `name` at `version` (empty: any), or `NOT_FOUND`.
    fn ready_model(&self, name: &str, version: &str) -> Result<Arc<ModelEntry>, Status> {
        let table = self.state.models.load();
        match table.get(name) {
            Some(entry) if entry.is_ready() && is_served_version(version) => Ok(entry.clone()),
            _ if !version.is_empty() => Err(ErrorCode::NotFound
                .to_status(format!("Model '{name}' version '{version}' not found"))),
            _ => Err(ErrorCode::NotFound.to_status(format!("Model '{name}' not found"))),
        }
    }
}

fn is_served_version(version: &str) -> bool {
    version.is_empty() || version == MODEL_VERSION
}

fn tensor(name: &str, datatype: &str, shape: i64) -> TensorMetadata {
    TensorMetadata {
        name: name.into(),
        datatype: datatype.into(),
        shape: vec![shape],
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for KserveService {
    async fn server_live(
        &self,
        _request: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _request: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        let ready = self.state.check_accepting().is_ok()
            && self.state.models.load().values().any(|e| e.is_ready());
        Ok(Response::new(ServerReadyResponse { ready }))
    }

    async fn model_ready(
        &self,
        request: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        let request = request.into_inner();
        let ready = self.ready_model(&request.name, &request.version).is_ok();
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _request: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "kvmesh".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: vec!["model_configuration".into(), "parameters".into()],
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let request = request.into_inner();
        let entry = self.ready_model(&request.name, &request.version)?;
        Ok(Response::new(ModelMetadataResponse {
            name: entry.name.clone(),
            versions: vec![MODEL_VERSION.into()],
            platform: PLATFORM.into(),
            inputs: vec![
                tensor(TEXT_INPUT, "BYTES", 1),
                tensor("streaming", "BOOL", 1),
            ],
            outputs: vec![
                tensor(TEXT_OUTPUT, "BYTES", -1),
                tensor(FINISH_REASON, "BYTES", -1),
            ],
        }))
    }

    async fn model_config(
        &self,
        request: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        let request = request.into_inner();
        let entry = self.ready_model(&request.name, &request.version)?;
        let input = |name: &str, data_type: DataType, optional: bool| ModelInput {
            name: name.into(),
            data_type: data_type.into(),
            dims: vec![1],
            optional,
        };
        let output = |name: &str| ModelOutput {
            name: name.into(),
            data_type: DataType::TypeString.into(),
            dims: vec![-1],
        };
        Ok(Response::new(ModelConfigResponse {
            config: Some(ModelConfig {
                name: entry.name.clone(),
                platform: PLATFORM.into(),
                backend: PLATFORM.into(),
                max_batch_size: 0,
                input: vec![
                    input(TEXT_INPUT, DataType::TypeString, false),
                    input("streaming", DataType::TypeBool, true),
                ],
                output: vec![output(TEXT_OUTPUT), output(FINISH_REASON)],
            }),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        crate::auth::check_grpc(self.state.api_keys.as_deref(), request.metadata())?;
        let parent = Trace::from_metadata(request.metadata());
        let prepared = infer::prepare(&self.state, request.into_inner(), INFER_ENDPOINT, false)
            .map_err(|error| error.to_status())?
            .with_parent(parent);
        infer::unary(&self.state, prepared, INFER_ENDPOINT)
            .await
            .map(Response::new)
            .map_err(|error| error.to_status())
    }

    type ModelStreamInferStream =
        tokio_stream::wrappers::ReceiverStream<Result<ModelStreamInferResponse, Status>>;

    async fn model_stream_infer(
        &self,
        request: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        crate::auth::check_grpc(self.state.api_keys.as_deref(), request.metadata())?;
        Ok(Response::new(super::stream::serve(
            self.state.clone(),
            request.into_inner(),
            self.stream_concurrency,
        )))
    }
}
