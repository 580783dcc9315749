//! `local-boost` is a Weir hook plugin written in Rust with the Rust SDK
//! (`sdk/rust`, crate `weir_plugin`): it prefers the endpoints that run on
//! this node.
//!
//! For every service whose annotation `local-boost.weir.dev/factor` is an
//! integer from 2 to 100, it multiplies the weight of the endpoints flagged
//! local by that factor (saturating at `u32::MAX`), editing the batch in place.
//! Other services are left untouched; a service with an invalid factor is
//! left untouched and the reason goes to stderr (Weir's log).

use weir_plugin::{export_plugin, is_null, log, Batch, Plugin};

const ANNOTATION: &str = "local-boost.weir.dev/factor";
const MIN_FACTOR: u32 = 2;
const MAX_FACTOR: u32 = 100;

/// The plugin; it has no configuration and keeps no state.
#[derive(Default)]
struct LocalBoost;

impl Plugin for LocalBoost {
    /// Accepts only an absent configuration (JSON `null`).
    fn configure(&mut self, config: &[u8]) -> Result<(), String> {
        if is_null(config) {
            return Ok(());
        }
        Err(format!(
            "config must be null: local-boost reads the annotation {ANNOTATION} of each service; got {}",
            preview(&String::from_utf8_lossy(config))
        ))
    }

    /// Boosts the local endpoints of every service with a valid factor.
    fn process(&mut self, batch: &mut Batch<'_>) -> Result<(), String> {
        for i in 0..batch.len() {
            let factor = match factor_of(batch, i) {
                Some(factor) => factor,
                None => continue,
            };
            let mut service = batch.service_mut(i);
            for slot in 0..service.len() {
                let endpoint = service.view().endpoint(slot);
                if endpoint.local() {
                    let weight = endpoint.weight().saturating_mul(factor);
                    service.set_weight(slot, weight);
                }
            }
        }
        Ok(())
    }
}

export_plugin!(LocalBoost);

/// Returns service `i`'s boost factor: None when the annotation is absent
/// or invalid (the reason for an invalid one is logged).
fn factor_of(batch: &Batch<'_>, i: usize) -> Option<u32> {
    let service = batch.service(i);
    let value = service.annotation(ANNOTATION)?;
    let factor = parse_factor(value);
    if factor.is_none() {
        log(&format!(
            "service {}: annotation {ANNOTATION} is {}, want an integer from {MIN_FACTOR} to {MAX_FACTOR}; left unchanged",
            service.key(),
            preview(value)
        ));
    }
    factor
}

/// Parses a factor: decimal digits only, from `MIN_FACTOR` to `MAX_FACTOR`.
fn parse_factor(value: &str) -> Option<u32> {
    if value.is_empty() || value.len() > 3 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let factor: u32 = value.parse().ok()?;
    if (MIN_FACTOR..=MAX_FACTOR).contains(&factor) {
        Some(factor)
    } else {
        None
    }
}

/// Returns `text` quoted and cut to 64 characters, to keep a log line
/// under Weir's 512-byte limit.
fn preview(text: &str) -> String {
    let mut cut: String = text.chars().take(64).collect();
    if cut.len() < text.len() {
        cut.push_str("...");
    }
    format!("{cut:?}")
}
