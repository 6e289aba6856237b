//! Which models get a processor engine: every token-input model with a live worker. The host
//! follows discovery with the house's model-table watcher and tells the interpreter when a model's
//! first worker registers, when its card changes and when its last worker leaves; the Python side
//! calls the processor's factory (with retries) on each change.

use std::collections::HashMap;

use kvmesh_router::fleet::DiscoveredRecords;
use kvmesh_router::fleet::watch::{FleetTable, WatchError};
use kvmesh_runtime::discovery::registry::card_checksum;
use tokio_util::sync::CancellationToken;

use crate::python::{PythonHost, ToPython};

/// The models the interpreter has an engine (or a build under way) for, by their card checksum.
pub struct ProcessorModels {
    python: PythonHost,
    built: HashMap<String, String>,
}

impl ProcessorModels {
    /// A table that reports its changes to `python`.
    pub fn new(python: PythonHost) -> Self {
        Self {
            python,
            built: HashMap::new(),
        }
    }
}

/// Whether a card's worker takes token ids: only those models are preprocessed by a processor.
fn takes_tokens(card: &kvmesh_proto::v1::ModelCard) -> bool {
    !card.model_input.eq_ignore_ascii_case("text")
}

impl FleetTable for ProcessorModels {
    async fn reconcile(
        &mut self,
        records: &DiscoveredRecords,
        _shutdown: &CancellationToken,
    ) -> Result<(), WatchError> {
        let serving = records.serving();
        self.built.retain(|model, _| {
            let is_served = serving.contains_key(model);
            if !is_served {
                self.python.send(ToPython::ModelRemoved {
                    model: model.clone(),
                });
            }
            is_served
        });
        for (model, workers) in serving {
            let mut cards: Vec<_> = workers
                .iter()
                .filter_map(|(record, _)| record.card.as_ref().map(|card| (record, card)))
                .filter(|(_, card)| takes_tokens(card))
                .map(|(record, card)| (record.instance_id, card, card_checksum(card)))
                .collect();
            cards.sort_by_key(|(instance_id, _, _)| *instance_id);
            let current = self.built.get(&model);
            if cards
                .iter()
                .any(|(_, _, checksum)| Some(checksum) == current)
            {
                continue;
            }
            let Some((instance_id, card, checksum)) = cards.into_iter().next() else {
                continue;
            };
            let card_json = serde_json::to_string(card)
                .map_err(|e| WatchError::Fatal(format!("model card of {model}: {e}")))?;
            self.python.send(ToPython::ModelChanged {
                model: model.clone(),
                instance_id,
                card_json,
                checksum: checksum.clone(),
            });
            self.built.insert(model, checksum);
        }
        Ok(())
    }

    fn tick(&mut self) -> bool {
        false
    }

    /// A processor host routes nothing.
    fn instance_departed(&mut self, _instance_id: u64) {}

    fn publish(&self) {}
}
