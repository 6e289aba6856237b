//! `GET /v1/models`.

use serde::{Deserialize, Serialize};

use super::common::{ListObject, ModelObjectTag};

/// `{"object":"list","data":[...]}`: the models that have a ready worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelList {
    /// Always `"list"`.
    pub object: ListObject,
    /// One entry per model.
    pub data: Vec<ModelObject>,
}

/// One served model.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelObject {
    /// The name clients put in `model`.
    pub id: String,
    /// Always `"model"`.
    pub object: ModelObjectTag,
    /// Unix seconds when the model was registered.
    pub created: u64,
    /// Who serves it.
    pub owned_by: String,
}

impl ModelList {
    /// A list of models.
    pub fn new(data: Vec<ModelObject>) -> Self {
        Self {
            object: ListObject,
            data,
        }
    }
}

impl ModelObject {
    /// One model entry.
    pub fn new(id: impl Into<String>, created: u64, owned_by: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            object: ModelObjectTag,
            created,
            owned_by: owned_by.into(),
        }
    }
}
