//! Value parsers of the router flags: each names what it accepts in its error.

use super::Nullable;

fn number(value: &str) -> Result<f64, String> {
    value
        .trim()
        .parse::<f64>()
        .map_err(|_| format!("not a number: {value:?}"))
}

pub(super) fn finite_non_negative(value: &str) -> Result<f64, String> {
    let x = number(value)?;
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(format!("must be >= 0, got {value}"))
    }
}

pub(super) fn positive(value: &str) -> Result<f64, String> {
    let x = number(value)?;
    if x.is_finite() && x > 0.0 {
        Ok(x)
    } else {
        Err(format!("must be > 0, got {value}"))
    }
}

pub(super) fn unit_interval(value: &str) -> Result<f64, String> {
    let x = number(value)?;
    if (0.0..=1.0).contains(&x) {
        Ok(x)
    } else {
        Err(format!("must be between 0 and 1, got {value}"))
    }
}

pub(super) fn prune_ratio(value: &str) -> Result<f64, String> {
    let x = number(value)?;
    if x > 0.0 && x <= 1.0 {
        Ok(x)
    } else {
        Err(format!("must be in (0, 1], got {value}"))
    }
}

fn is_none(value: &str) -> bool {
    value.trim() == "None"
}

pub(super) fn nullable_fraction(value: &str) -> Result<Nullable<f64>, String> {
    if is_none(value) {
        return Ok(Nullable(None));
    }
    unit_interval(value).map(|x| Nullable(Some(x)))
}

pub(super) fn nullable_non_negative(value: &str) -> Result<Nullable<f64>, String> {
    if is_none(value) {
        return Ok(Nullable(None));
    }
    finite_non_negative(value).map(|x| Nullable(Some(x)))
}

pub(super) fn nullable_tokens(value: &str) -> Result<Nullable<u64>, String> {
    if is_none(value) {
        return Ok(Nullable(None));
    }
    value
        .trim()
        .parse::<u64>()
        .map(|x| Nullable(Some(x)))
        .map_err(|_| format!("must be a non-negative integer or None, got {value}"))
}
