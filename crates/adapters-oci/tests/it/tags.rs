//! A repository's tag list: pages followed through their `Link` headers with the page size
//! asked for, and a registry whose pages leave the tag list, never end, list another
//! repository or are too large: each refused with its typed error.

use super::*;

use guild_domain::distribution::OciRepository;

fn tags_json(name: &str, tags: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"name": name, "tags": tags})).unwrap()
}

/// A page of `tags` whose `Link` names `next` (relative), if any.
fn page(tags: &[&str], next: Option<&str>) -> Answer {
    let mut answer = ok("application/json", tags_json("scan", tags));
    if let Some(next) = next {
        answer
            .headers
            .push(("Link".into(), format!("<{next}>; rel=\"next\"")));
    }
    answer
}

fn repository(port: u16) -> OciRepository {
    OciRepository::parse(&format!("oci://127.0.0.1:{port}/scan")).unwrap()
}

/// The tag list requests the server saw, as `METHOD TARGET`.
fn tag_requests(server: &Server) -> Vec<String> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.contains("/tags/list"))
        .collect()
}

/// The settings with pages of `size` tags.
fn pages_of(size: u32) -> OciSettings {
    with_limits(|l| l.tags_page_size = size)
}

#[test]
fn every_page_is_followed_through_its_link_with_the_page_size_asked_for() {
    let server = serve_seen(HashMap::from([
        (
            "/v2/scan/tags/list?n=2".to_owned(),
            page(
                &["1.0.0", "1.2.0"],
                Some("/v2/scan/tags/list?n=2&last=1.2.0"),
            ),
        ),
        (
            "/v2/scan/tags/list?n=2&last=1.2.0".to_owned(),
            page(
                &["1.3.0-rc.1", "2.0.0"],
                Some("/v2/scan/tags/list?n=2&last=2.0.0"),
            ),
        ),
        (
            "/v2/scan/tags/list?n=2&last=2.0.0".to_owned(),
            page(&["latest", "1.0.0"], None),
        ),
    ]));
    let tags = OciRegistry::new(pages_of(2))
        .list_tags(&repository(server.port))
        .unwrap();
    // A tag listed twice is kept once.
    assert_eq!(tags, ["1.0.0", "1.2.0", "1.3.0-rc.1", "2.0.0", "latest"]);
    assert_eq!(
        tag_requests(&server),
        [
            "GET /v2/scan/tags/list?n=2",
            "GET /v2/scan/tags/list?n=2&last=1.2.0",
            "GET /v2/scan/tags/list?n=2&last=2.0.0",
        ]
    );
}

#[test]
fn a_next_page_off_the_tag_list_is_refused_before_it_is_fetched() {
    for link in [
        "http://127.0.0.2:1/v2/scan/tags/list?last=x",
        "/v2/other/tags/list?last=x",
        "/v2/scan/blobs/uploads/",
    ] {
        let server = serve_seen(HashMap::from([(
            "/v2/scan/tags/list?n=1000".to_owned(),
            page(&["1.0.0"], Some(link)),
        )]));
        let err = OciRegistry::default()
            .list_tags(&repository(server.port))
            .unwrap_err();
        assert!(
            matches!(&err.kind, Kind::Malformed { part: Part::Tags, reason } if reason.contains("leaves the tag list")),
            "{link}: {err}"
        );
        // The error names the repository, not a reference.
        assert_eq!(err.reference, repository(server.port).to_string());
        assert_eq!(tag_requests(&server).len(), 1, "{link}");
    }
}

#[test]
fn a_tag_list_that_never_ends_is_cut_off_at_the_page_limit() {
    // Every page names itself as the next one.
    let server = serve_seen(HashMap::from([(
        "/v2/scan/tags/list".to_owned(),
        page(&["1.0.0"], Some("/v2/scan/tags/list?n=1000")),
    )]));
    let settings = with_limits(|l| l.tags_pages = 5);
    let err = OciRegistry::new(settings)
        .list_tags(&repository(server.port))
        .unwrap_err();
    assert!(
        matches!(&err.kind, Kind::Malformed { part: Part::Tags, reason } if reason.contains("past 5 pages")),
        "{err}"
    );
    assert_eq!(tag_requests(&server).len(), 5);
}

#[test]
fn a_page_of_another_repository_an_invalid_tag_or_over_the_limit_is_refused() {
    let cases: Vec<(Answer, &str)> = vec![
        (
            ok("application/json", tags_json("other", &["1.0.0"])),
            "not of \"scan\"",
        ),
        (
            ok("application/json", tags_json("scan", &["a/b"])),
            "is not a tag",
        ),
        (ok("application/json", b"[]".to_vec()), "no \"name\""),
        (endless(200, HUGE), "larger than"),
    ];
    for (answer, says) in cases {
        let server = serve_seen(HashMap::from([("/v2/scan/tags/list".to_owned(), answer)]));
        let err = OciRegistry::default()
            .list_tags(&repository(server.port))
            .unwrap_err();
        assert!(err.to_string().contains(says), "{says}: {err}");
    }
    // A repository the registry does not know.
    let server = serve_seen(HashMap::new());
    let err = OciRegistry::default()
        .list_tags(&repository(server.port))
        .unwrap_err();
    assert_eq!(err.kind, Kind::NotFound);
}
