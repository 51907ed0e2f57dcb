//! The stored response encoding and record rows (the storage contract's columns).
use idempo_core::record::{Record, RecordRow, StoredResponse};
use napi::Env;
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

use crate::error::{Fail, code};
use crate::num::{MAX_SAFE, to_status};

/// A response as stored for replays: status, allow-listed headers (name/value pairs) and body.
#[napi(object)]
pub struct ResponseData {
    /// HTTP status.
    pub status: u32,
    /// Header fields as `[name, value]` pairs, in order.
    pub headers: Vec<Vec<String>>,
    /// Body bytes.
    pub body: Buffer,
}

/// One `idempo_record` row (every column but `scope_key`).
#[napi(object)]
pub struct RecordRowData {
    /// `v1:<hex>` or `h1:<hex>`.
    pub fingerprint: String,
    /// 1 in progress, 2 completed, 3 outcome unknown.
    pub state: i32,
    /// The 16-byte fencing token.
    pub token: Buffer,
    /// Generation, from 1.
    pub generation: f64,
    /// Lease deadline (unix ms) while in progress, else null.
    pub lease_until: Option<f64>,
    /// Expiry (unix ms).
    pub expires_at: f64,
    /// The encoded response when completed, else null.
    pub response: Option<Buffer>,
}

/// Header pairs from JS (`[name, value]` arrays).
pub(crate) fn header_pairs(headers: Vec<Vec<String>>) -> Result<Vec<(String, String)>, Fail> {
    headers
        .into_iter()
        .map(|pair| match <[String; 2]>::try_from(pair) {
            Ok([name, value]) => Ok((name, value)),
            Err(p) => Err(Fail::new(
                code::INVALID_ARGUMENT,
                format!(
                    "a header must be a [name, value] pair, got {} items",
                    p.len()
                ),
            )),
        })
        .collect()
}

/// Response data for JS.
pub(crate) fn response_data(r: StoredResponse) -> ResponseData {
    ResponseData {
        status: u32::from(r.status),
        headers: r.headers.into_iter().map(|(n, v)| vec![n, v]).collect(),
        body: Buffer::from(r.body),
    }
}

/// Converts a JS-number time column to the row's signed integer.
#[allow(clippy::cast_possible_truncation)]
fn time_column(v: f64, name: &str) -> Result<i64, Fail> {
    if v.is_finite() && v.fract() == 0.0 && v.abs() <= MAX_SAFE {
        Ok(v as i64)
    } else {
        Err(Fail::new(
            code::RECORD_CORRUPT,
            format!("column {name} is not an integer: {v}"),
        ))
    }
}

/// A row from JS as core's row type.
pub(crate) fn to_row(r: &RecordRowData) -> Result<RecordRow, Fail> {
    Ok(RecordRow {
        fingerprint: r.fingerprint.clone(),
        state: i64::from(r.state),
        token: r.token.to_vec(),
        generation: time_column(r.generation, "generation")?,
        lease_until_ms: r
            .lease_until
            .map(|v| time_column(v, "lease_until"))
            .transpose()?,
        expires_at_ms: time_column(r.expires_at, "expires_at")?,
        response: r.response.as_ref().map(|b| b.to_vec()),
    })
}

/// Validates a row against the storage contract and returns core's record.
pub(crate) fn to_record(r: &RecordRowData) -> Result<Record, Fail> {
    Record::from_row(to_row(r)?).map_err(|e| Fail::new(code::RECORD_CORRUPT, e.to_string()))
}

/// Core's record as a JS row.
pub(crate) fn from_record(r: &Record) -> Result<RecordRowData, Fail> {
    let row = r
        .to_row()
        .map_err(|e| Fail::new(code::RECORD_CORRUPT, e.to_string()))?;
    #[allow(clippy::cast_precision_loss)]
    let t = |v: i64| v as f64;
    Ok(RecordRowData {
        fingerprint: row.fingerprint,
        state: i32::try_from(row.state).unwrap_or(i32::MAX),
        token: Buffer::from(row.token),
        generation: t(row.generation),
        lease_until: row.lease_until_ms.map(t),
        expires_at: t(row.expires_at_ms),
        response: row.response.map(Buffer::from),
    })
}

/// Encodes a response into the versioned `response` column format.
#[napi(catch_unwind)]
pub fn encode_response(env: Env, response: ResponseData) -> napi::Result<Buffer> {
    let status = to_status(response.status).map_err(|f| f.throw(&env))?;
    let headers = header_pairs(response.headers).map_err(|f| f.throw(&env))?;
    StoredResponse {
        status,
        headers,
        body: response.body.to_vec(),
    }
    .encode()
    .map(Buffer::from)
    .map_err(|e| Fail::new(code::INVALID_ARGUMENT, e.to_string()).throw(&env))
}

/// Decodes a `response` column (throws `RECORD_CORRUPT` on malformed bytes).
#[napi(catch_unwind)]
pub fn decode_response(env: Env, encoded: &[u8]) -> napi::Result<ResponseData> {
    StoredResponse::decode(encoded)
        .map(response_data)
        .map_err(|e| Fail::new(code::RECORD_CORRUPT, e.to_string()).throw(&env))
}

/// Checks a row against the storage contract (throws `RECORD_CORRUPT`) and returns it in
/// canonical form (the response re-encoded in the current version).
#[napi(catch_unwind)]
pub fn check_record_row(env: Env, row: RecordRowData) -> napi::Result<RecordRowData> {
    to_record(&row)
        .and_then(|r| from_record(&r))
        .map_err(|f| f.throw(&env))
}

/// The row a Redis record hash holds (`spec/STORAGE.md` §5.1), from an `HGETALL` reply as a
/// flat field/value list of buffers (core's `RecordRow::from_redis_hash`); `null` for an empty
/// reply. Throws `RECORD_CORRUPT` for an odd list, a missing field or a number that is not one.
#[napi(catch_unwind)]
pub fn redis_hash_row(env: Env, flat: Vec<Buffer>) -> napi::Result<Option<RecordRowData>> {
    let run = || {
        if !flat.len().is_multiple_of(2) {
            return Err(Fail::new(
                code::RECORD_CORRUPT,
                format!(
                    "HGETALL answered {} items (field/value pairs expected)",
                    flat.len()
                ),
            ));
        }
        let pairs = flat.chunks_exact(2).map(|p| (&p[0][..], &p[1][..]));
        let Some(row) = RecordRow::from_redis_hash(pairs)
            .map_err(|e| Fail::new(code::RECORD_CORRUPT, e.to_string()))?
        else {
            return Ok(None);
        };
        #[allow(clippy::cast_precision_loss)]
        let t = |v: i64| v as f64;
        Ok(Some(RecordRowData {
            state: i32::try_from(row.state).map_err(|_| {
                Fail::new(
                    code::RECORD_CORRUPT,
                    format!("unknown state code {}", row.state),
                )
            })?,
            fingerprint: row.fingerprint,
            token: Buffer::from(row.token),
            generation: t(row.generation),
            lease_until: row.lease_until_ms.map(t),
            expires_at: t(row.expires_at_ms),
            response: row.response.map(Buffer::from),
        }))
    };
    run().map_err(|f| f.throw(&env))
}
