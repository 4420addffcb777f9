//! The spec's parser and validator under libFuzzer: any bytes, parsed as kOps documents and, when
//! they parse, validated. A panic is a crash (docs/fuzzing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    if let Ok(docs) = keelson_api::parse_documents(bytes) {
        let _ = keelson_api::validate(&docs);
    }
});
