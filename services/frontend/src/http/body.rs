//! Reading request bodies under two bounds (docs/security.md, "Bounded resources"): each body is
//! at most `--http-body-limit-mb` (413 past it), and all bodies being read or parsed at once hold
//! at most `--http-body-budget-mb` between them. A body that does not fit in what is left of the
//! budget waits up to `--http-body-budget-wait-ms` for earlier ones to be parsed and dropped, and
//! is then refused with the overload status in the route's error shape, before its bytes are
//! read. A body larger than the whole budget is read alone.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::AppState;
use crate::error::FrontendError;

/// The budget counts KiB: a semaphore takes at most `u32::MAX` permits at a time.
const UNIT: usize = 1024;

/// The process's budget of body bytes held at once.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    units: Arc<Semaphore>,
    total_units: u32,
    wait: Duration,
}

impl BodyBudget {
    /// A budget of `mb` MiB; a body that does not fit waits at most `wait`.
    pub fn new(mb: u64, wait: Duration) -> Self {
        let units = mb.saturating_mul(1024).clamp(1, u64::from(u32::MAX));
        let total_units = u32::try_from(units).unwrap_or(u32::MAX);
        Self {
            units: Arc::new(Semaphore::new(total_units as usize)),
            total_units,
            wait,
        }
    }

    /// KiB of the budget free now.
    pub fn available_kib(&self) -> usize {
        self.units.available_permits()
    }

    /// Takes `bytes` more of the budget into `held`, waiting at most the budget's wait.
    async fn take(
        &self,
        held: &mut Option<OwnedSemaphorePermit>,
        bytes: usize,
    ) -> Result<(), FrontendError> {
        let held_units = held.as_ref().map_or(0, |permit| permit.num_permits());
        let wanted = bytes.div_ceil(UNIT).min(self.total_units as usize);
        let Some(more) = wanted.checked_sub(held_units).filter(|more| *more > 0) else {
            return Ok(());
        };
        let more = u32::try_from(more).unwrap_or(self.total_units);
        let acquire = Arc::clone(&self.units).acquire_many_owned(more);
        match tokio::time::timeout(self.wait, acquire).await {
            Ok(Ok(permit)) => {
                match held {
                    Some(held) => held.merge(permit),
                    None => *held = Some(permit),
                }
                Ok(())
            }
            Ok(Err(_)) | Err(_) => {
                tracing::debug!(bytes, "request body over the body budget");
                Err(FrontendError::Route(kvmesh_routing::RouteError::Overloaded))
            }
        }
    }
}

/// A request body read whole, holding its share of the body budget until it is dropped.
#[derive(Debug)]
pub struct Body {
    bytes: Bytes,
    _budget: Option<OwnedSemaphorePermit>,
}

impl Deref for Body {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Reads a request body whole into one buffer sized from `content-length`, refusing (413) a body
/// over the limit before reading it when its length is declared, and as soon as it passes the
/// limit otherwise; the body budget is taken for the declared length before reading, or frame by
/// frame for a body of unknown length. Unlike collecting the frames and joining them, the body is
/// in memory once.
pub(crate) async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<Body, FrontendError> {
    use futures::StreamExt as _;

    let limit = usize::try_from(state.settings.body_limit_mb.saturating_mul(1024 * 1024))
        .unwrap_or(usize::MAX);
    let too_large = || FrontendError::PayloadTooLarge {
        limit_mb: state.settings.body_limit_mb,
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(too_large());
    }
    let mut budget = None;
    state
        .body_budget
        .take(&mut budget, declared.unwrap_or(0))
        .await?;
    let mut buffer = bytes::BytesMut::with_capacity(declared.unwrap_or(0));
    let mut frames = body.into_data_stream();
    while let Some(frame) = frames.next().await {
        let frame = frame.map_err(|error| {
            FrontendError::invalid(format!("cannot read request body: {error}"), None)
        })?;
        let len = buffer.len() + frame.len();
        if len > limit {
            return Err(too_large());
        }
        state.body_budget.take(&mut budget, len).await?;
        buffer.extend_from_slice(&frame);
    }
    Ok(Body {
        bytes: buffer.freeze(),
        _budget: budget,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_that_does_not_fit_waits_then_is_refused_and_the_budget_comes_back() {
        let budget = BodyBudget::new(1, Duration::from_millis(50));
        let mut first = None;
        budget.take(&mut first, 700 * 1024).await.unwrap();
        let mut second = None;
        let refused = budget.take(&mut second, 400 * 1024).await;
        assert!(matches!(
            refused,
            Err(FrontendError::Route(kvmesh_routing::RouteError::Overloaded))
        ));
        assert!(second.is_none());
        // Growing a held share takes only the difference.
        budget.take(&mut first, 1000 * 1024).await.unwrap();
        assert_eq!(budget.available_kib(), 24);
        drop(first);
        assert_eq!(budget.available_kib(), 1024);
        // A body larger than the whole budget is read alone.
        let mut large = None;
        budget.take(&mut large, 5 << 20).await.unwrap();
        assert_eq!(budget.available_kib(), 0);
    }

    #[tokio::test]
    async fn a_waiting_body_goes_in_once_an_earlier_one_is_dropped() {
        let budget = BodyBudget::new(1, Duration::from_secs(5));
        let mut first = None;
        budget.take(&mut first, 1 << 20).await.unwrap();
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move {
                let mut second = None;
                budget.take(&mut second, 1 << 20).await.map(|()| second)
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(first);
        assert!(waiting.await.unwrap().unwrap().is_some());
    }
}
