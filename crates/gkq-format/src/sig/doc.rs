//! The serde shapes of the signature object's JSON (FORMAT.md 7c): what
//! `open` reads; building uses `serde_json::json!`.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct BundleDoc {
    pub(super) media_type: String,
    pub(super) verification_material: Material,
    pub(super) dsse_envelope: Envelope,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Material {
    pub(super) public_key: Option<KeyHint>,
}

#[derive(Deserialize)]
pub(super) struct KeyHint {
    pub(super) hint: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Envelope {
    pub(super) payload: String,
    pub(super) payload_type: String,
    pub(super) signatures: Vec<SigDoc>,
}

#[derive(Deserialize)]
pub(super) struct SigDoc {
    pub(super) sig: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StatementDoc {
    #[serde(rename = "_type")]
    pub(super) kind: String,
    pub(super) subject: Vec<Subject>,
    pub(super) predicate_type: String,
    pub(super) predicate: Predicate,
}

#[derive(Deserialize)]
pub(super) struct Subject {
    pub(super) name: String,
    pub(super) digest: BTreeMap<String, String>,
}

#[derive(Deserialize)]
pub(super) struct Predicate {
    pub(super) resources: Vec<ResourceDoc>,
    pub(super) gkq: Option<Claim>,
    pub(super) serialization: Option<Serialization>,
}

#[derive(Deserialize)]
pub(super) struct Serialization {
    pub(super) method: Option<String>,
    pub(super) hash_type: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct ResourceDoc {
    pub(super) name: String,
    pub(super) algorithm: String,
    pub(super) digest: String,
}

#[derive(Deserialize)]
pub(super) struct Claim {
    pub(super) knot_id: String,
    /// Absent, or a string: `"name": null` is malformed (FORMAT.md 7c), not
    /// an unnamed statement.
    #[serde(default, deserialize_with = "present_string")]
    pub(super) name: Option<String>,
}

/// A member that, when present, is a string (null included in what is not).
fn present_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => Ok(Some(s)),
        other => Err(serde::de::Error::custom(format!(
            "predicate.gkq.name is {other}, not a string"
        ))),
    }
}
