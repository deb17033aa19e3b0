//! Fuzzes the canonical form: for every accepted document, the canonical bytes parse, and
//! canonicalising them again is a fixed point; the pretty form canonicalises to the same bytes.

#![no_main]

use guild_domain::canonical::canonicalize;
use guild_domain::json;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = json::parse(data) else { return };
    let once = canonicalize(&value);
    let reread = json::parse(&once).expect("canonical bytes parse");
    assert_eq!(
        canonicalize(&reread),
        once,
        "canonicalisation is not a fixed point"
    );

    let pretty = json::parse(value.to_pretty_string().as_bytes()).expect("pretty form parses");
    assert_eq!(
        canonicalize(&pretty),
        once,
        "pretty form canonicalises differently"
    );
});
