//! Fuzz the `response` column decoder and row validation with arbitrary bytes: no panic, no
//! over-allocation; a decoded response re-encodes to exactly the input (the encoding has one
//! spelling per response), and a row accepted by `Record::from_row` survives `to_row` unchanged.
#![no_main]

use idempo_core::record::{Record, RecordRow, StoredResponse};
use libfuzzer_sys::fuzz_target;

fn row_from(data: &[u8]) -> Option<RecordRow> {
    let (head, rest) = data.split_at_checked(8)?;
    let token_len = usize::from(head[1] % 20);
    let (token, rest) = rest.split_at_checked(token_len.min(rest.len()))?;
    let fp_len = usize::from(head[2] % 80);
    let (fp, rest) = rest.split_at_checked(fp_len.min(rest.len()))?;
    let wide = |b: u8| -> i64 {
        match b % 6 {
            0 => -1,
            1 => 0,
            2 => i64::from(b) * 1000,
            3 => i64::MAX,
            4 => 1_700_000_000_000 + i64::from(b),
            _ => 1_700_000_000_000 - i64::from(b),
        }
    };
    Some(RecordRow {
        fingerprint: String::from_utf8_lossy(fp).into_owned(),
        state: i64::from(head[0] % 5),
        token: token.to_vec(),
        generation: match head[3] % 4 {
            0 => 0,
            1 => 1,
            2 => i64::from(u32::MAX),
            _ => i64::from(head[3]),
        },
        lease_until_ms: (head[4] & 1 == 1).then(|| wide(head[5])),
        expires_at_ms: wide(head[6]),
        response: (head[7] & 1 == 1).then(|| rest.to_vec()),
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(resp) = StoredResponse::decode(data) {
        let again = resp.encode().expect("a decoded response encodes");
        assert_eq!(again, data, "one spelling per response");
        assert!((100..=599).contains(&resp.status));
    }
    if let Some(row) = row_from(data) {
        if let Ok(record) = Record::from_row(row.clone()) {
            assert_eq!(record.generation as i64, row.generation);
            let back = record.to_row().expect("a valid record encodes");
            let again = Record::from_row(back.clone()).expect("round trip");
            assert_eq!(again, record);
            assert_eq!(back.state, row.state);
            assert_eq!(back.token, row.token);
            assert_eq!(back.lease_until_ms, row.lease_until_ms);
            if let Some(lease) = record.lease_until_ms() {
                assert!(
                    lease <= record.expires_at_ms,
                    "lease never outlives the record"
                );
            }
        }
    }
});
