//! Fuzzes `.gkmetadata` reading: no input may panic, and whatever is accepted must survive being
//! written back and read again with the same manifest and the same signed bytes.

#![no_main]

use guild_domain::canonical::canonicalize;
use guild_domain::manifest::{Manifest, Metadata};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Manifest::parse_payload(data);
    let Ok(meta) = Metadata::parse(data) else {
        return;
    };
    assert_eq!(
        meta.canonical_payload(),
        canonicalize(meta.payload()).as_slice()
    );

    let rewritten = meta.to_pretty_json();
    let reread = Metadata::parse(rewritten.as_bytes()).expect("written metadata reads back");
    assert_eq!(reread.manifest(), meta.manifest());
    assert_eq!(reread.canonical_payload(), meta.canonical_payload());

    let manifest = meta.manifest();
    let canonical = manifest.canonical_payload();
    let back = Manifest::parse_payload(&canonical).expect("the packer's payload reads back");
    assert_eq!(&back, manifest);
    assert_eq!(back.canonical_payload(), canonical);
});
