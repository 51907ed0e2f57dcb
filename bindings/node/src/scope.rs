//! Scope ids: the record key, a length-prefixed digest of (principal, method, route, key).
use idempo_core::scope::ScopeId;
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

/// The 32-byte scope id of (principal, method, route template, key).
#[napi(catch_unwind)]
#[must_use]
pub fn scope_id(principal: String, method: String, route: String, key: String) -> Buffer {
    Buffer::from(
        ScopeId::from_parts(&principal, &method, &route, &key)
            .as_bytes()
            .to_vec(),
    )
}

/// The scope id as 64 lowercase hex characters.
#[napi(catch_unwind)]
#[must_use]
pub fn scope_id_hex(principal: String, method: String, route: String, key: String) -> String {
    ScopeId::from_parts(&principal, &method, &route, &key).to_hex()
}
