//! G24's decode against the physical limit: a Llama of 8 layers and hidden size 512 decoded
//! greedily on one thread, beside the memory-bandwidth bound measured in the same run.
//!
//! A decode step of a small batch reads every weight once, so no implementation can produce
//! tokens faster than the machine streams the weights in: the bound is a one-thread streaming
//! read rate over the bytes of weights one token reads. One run:
//! - writes the model with `examples/llama-decode/make_tiny_llama.py` in f32 and in q8_0: 8
//!   layers, hidden 512, 8 query heads sharing 2 key/value heads (head size 64, Llama 3's group
//!   of 4), SwiGLU feed-forward 1536 (Llama's 8/3 of the hidden size rounded up to a multiple of
//!   256), vocabulary 32000 (Llama 2's), context 2048, random weights; with its numpy reference;
//! - installs the `example.llama.*` operations (test-plugins/llama_ops) as a signed gkmodule,
//!   and, where `cargo xtask plugins` built it, a second store with the AVX2/FMA module
//!   (test-plugins/llama_ops_avx2, higher priority) installed beside it, so that resolution picks
//!   between them; each matvec's resolved implementation is printed;
//! - decodes each model with each set of providers through the operation service (the
//!   example's loop) and through direct calls of the same implementations' C `execute` (bound
//!   from the descriptor the C service resolved; both sides' resolutions are compared), every
//!   decode checked against the reference. The two decode in lockstep: each forward pass is
//!   made on one side and at once on the other, the first of the two alternating, so that a
//!   pair sees the same moment of a shared machine and the host's share is computed per pair;
//!   the rounds go through every row in turn;
//! - measures the streaming read rate: a sum over a buffer of 8 times the last-level cache (at
//!   least 256 MiB), read whole, three passes each round; the median over every pass;
//! - prints tokens per second, the bytes of weights per token (every layer's matrices and norms,
//!   the output norm and matrix, one embedding row, as stored), the bound, the fraction of it
//!   reached, the host's share per token (`(service - direct) / service`, the median pair with
//!   a 95% interval), the load average, and a verdict against G24's goals (q8_0 with the faster
//!   provider at half the bound or more; the host's share under 1%, judged on the interval).
//!
//! Times are the measuring thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so that the time
//! other processes hold the core is not counted (on a shared machine it comes and goes from
//! one pass to the next); the wall-clock tokens/s are printed beside them. A token is a forward
//! pass: the prompt's tokens are fed one at a time, each a full pass over the weights.
//!
//! `cargo bench -p guild-host --bench decode_bound` runs the measurement (`-- --rounds N`, 7 by
//! default); with `-- --test` (or under `cargo test --benches`) it decodes the 2-layer tiny
//! model once per path over an 8 MiB buffer, which checks the machinery, not the machine. Needs
//! the C plugins (`cargo xtask plugins`) and python3 with the gguf and numpy packages.

#[path = "common/mod.rs"]
mod common;
#[path = "../../../examples/llama-decode/src/lib.rs"]
#[allow(dead_code)]
mod decode;
#[path = "common/direct_ops.rs"]
mod direct_ops;

use std::cell::{Cell, RefCell};
use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use guild_adapters_posix::DlopenLoader;
use guild_domain::operation::{DType, MemorySpace, TensorDesc};
use guild_host::ports::model::ModelFile;
use guild_host::{Host, InstallOptions, OpHandle, OperationService};
use guild_test_support::plugins::{plugin_dir, plugin_library};
use guild_test_support::{key, open_dir, trust, Spec, Workshop, PUBLISHER};

use decode::{
    Config, DecodeError, Decoder, Generation, In, Ops, Out, Provider, Reference, Service,
};
use decode::{Weights, MATVEC};
use direct_ops::Direct;

/// make_tiny_llama.py's options for the measured model (see the module docs for why these).
const SHAPE: [&str; 14] = [
    "--layers",
    "8",
    "--hidden",
    "512",
    "--heads",
    "8",
    "--kv-heads",
    "2",
    "--ff",
    "1536",
    "--vocab",
    "32000",
    "--context",
    "2048",
];

/// The weight storage types measured, as make_tiny_llama.py's `--dtype` names them.
const DTYPES: [&str; 2] = ["f32", "q8_0"];

/// An operation module to install: its package, its C library (target/test-plugins/lib) and
/// the implementation ids it registers (the manifest must list exactly those).
struct Module {
    package: &'static str,
    library: &'static str,
    impls: fn() -> Vec<String>,
}

/// The portable C module.
const PORTABLE: Module = Module {
    package: "example.llama_ops",
    library: "llama_ops",
    impls: || decode::MODULE_IMPLS.iter().map(|s| s.to_string()).collect(),
};

/// The AVX2/FMA module, built by `cargo xtask plugins` where test-plugins has it.
const AVX2: Module = Module {
    package: "example.llama_ops_avx2",
    library: "llama_ops_avx2",
    impls: avx2_impls,
};

/// The implementation ids the AVX2 build registers, read from its manifest template
/// (examples/modules/llama_ops_avx2), which `llama_isa`'s tests hold to what the library
/// registers; a package that lists other ids is refused at install, and its rows say why.
fn avx2_impls() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/modules/llama_ops_avx2/manifest.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let manifest: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    manifest["provided_ops"]
        .as_array()
        .unwrap_or_else(|| panic!("{} has no provided_ops", path.display()))
        .iter()
        .map(|id| id.as_str().expect("an impl id").to_owned())
        .collect()
}

/// A set of providers installed together in one store.
struct Providers {
    name: &'static str,
    modules: Vec<&'static Module>,
}

/// A host whose store has `modules` installed, each as version 1.0.0, signed by the test key.
fn host_with(shop: &Workshop, modules: &[&Module]) -> Result<Host, String> {
    let k = key();
    let (pm, _) = open_dir(&shop.fresh("store")).map_err(|e| format!("opening a store: {e}"))?;
    trust(&pm, PUBLISHER, &k);
    let host = Host::new(pm, Box::new(DlopenLoader::new()));
    for m in modules {
        let mut spec = Spec::module(m.package, "1.0.0").library(&plugin_library(m.library));
        spec.provided_ops = (m.impls)();
        host.install(&shop.build(&spec, &k).archive, InstallOptions::default())
            .map_err(|e| format!("installing {}: {e}", m.package))?;
    }
    Ok(host)
}

/// Writes the model and reference into `dir` with the example's script.
fn make_model(dir: &Path, dtype: &str, shape: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/llama-decode/make_tiny_llama.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(dir)
        .args(["--dtype", dtype])
        .args(shape)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "make_tiny_llama.py --dtype {dtype} {} failed (the benchmark needs python3 with gguf and \
         numpy):\n{}",
        shape.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The service's `Ops`, recording which implementation each resolution chose.
struct Traced<'r> {
    service: Service<'r>,
    resolved: RefCell<Vec<(String, String)>>,
    /// The executes made through it, to count the calls a token makes.
    calls: Cell<u64>,
}

impl<'r> Ops for Traced<'r> {
    type Handle = OpHandle<'r>;

    fn resolve(
        &self,
        op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<OpHandle<'r>, DecodeError> {
        let handle = self.service.resolve(op, inputs, outputs)?;
        let chosen = handle.describe().impl_id.to_string();
        self.resolved.borrow_mut().push((op.to_owned(), chosen));
        Ok(handle)
    }

    fn rebind(
        &self,
        handle: &mut OpHandle<'r>,
        op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<(), DecodeError> {
        self.service.rebind(handle, op, inputs, outputs)
    }

    #[inline]
    fn execute(
        &self,
        handle: &OpHandle<'r>,
        inputs: &[In<'_>],
        outputs: &mut [Out<'_>],
        params: &[u8],
    ) -> Result<(), DecodeError> {
        self.calls.set(self.calls.get() + 1);
        self.service.execute(handle, inputs, outputs, params)
    }

    fn provider(&self, handle: &OpHandle<'r>) -> Option<Provider> {
        self.service.provider(handle)
    }
}

/// The calling thread's CPU time: what it ran, whatever else shared its core meanwhile.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec for the call to write; the clock is the calling thread's.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(
        rc,
        0,
        "clock_gettime(CLOCK_THREAD_CPUTIME_ID): {}",
        std::io::Error::last_os_error()
    );
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A moment on both clocks.
#[derive(Clone, Copy)]
struct Stamp {
    wall: Instant,
    cpu: Duration,
}

impl Stamp {
    fn now() -> Stamp {
        Stamp {
            wall: Instant::now(),
            cpu: thread_cpu(),
        }
    }

    /// The span from `self` to `later`.
    fn to(self, later: Stamp) -> Span {
        Span {
            wall: (later.wall - self.wall).as_secs_f64(),
            cpu: (later.cpu - self.cpu).as_secs_f64(),
        }
    }
}

/// A span measured on both clocks, in seconds.
#[derive(Debug, Clone, Copy)]
struct Span {
    /// Wall-clock time: what a user waits.
    wall: f64,
    /// The thread's CPU time: the wall time less the time other processes had the core.
    cpu: f64,
}

/// Runs `f`, timing it on both clocks.
fn timed<R>(f: impl FnOnce() -> R) -> (R, Span) {
    let start = Stamp::now();
    let r = f();
    (r, start.to(Stamp::now()))
}

/// One decode in progress on one path, with what it produced so far.
struct Run<'d, 'm, 'o, O: Ops> {
    decoder: &'d mut Decoder<'m, 'o, O>,
    /// The token the next forward pass feeds.
    next: u32,
    got: Generation,
    what: String,
}

impl<'d, 'm, 'o, O: Ops> Run<'d, 'm, 'o, O> {
    fn new(decoder: &'d mut Decoder<'m, 'o, O>, reference: &Reference, what: String) -> Self {
        decoder.restart();
        Run {
            decoder,
            next: reference.prompt[0],
            got: Generation {
                tokens: Vec::new(),
                logits: Vec::new(),
            },
            what,
        }
    }

    /// Forward pass `i` of the decode: a prompt token is fed, and from the prompt's last token
    /// on the next token is chosen (the argmax) as `decode::generate` does. Returns the time of
    /// the pass and the argmax; the copy of the logits kept for the reference is not timed.
    fn forward(&mut self, i: usize, reference: &Reference) -> Span {
        let decoding = i + 1 >= reference.prompt.len();
        let fail = |e: DecodeError| -> ! { panic!("{}: the decode failed: {e}", self.what) };
        let start = Stamp::now();
        let logits = match self.decoder.step(self.next) {
            Ok(logits) => logits,
            Err(e) => fail(e),
        };
        if !decoding {
            let span = start.to(Stamp::now());
            self.next = reference.prompt[i + 1];
            return span;
        }
        let stepped = Stamp::now();
        self.got.logits.push(logits.to_vec());
        let copied = Stamp::now();
        self.next = self.decoder.argmax().unwrap_or_else(|e| fail(e));
        let end = Stamp::now();
        self.got.tokens.push(self.next);
        let (a, b) = (start.to(stepped), copied.to(end));
        Span {
            wall: a.wall + b.wall,
            cpu: a.cpu + b.cpu,
        }
    }

    /// Checks the finished decode against the reference.
    fn check(&self, reference: &Reference) {
        let comparison = reference.compare(&self.got);
        assert!(
            comparison.matches(),
            "{}: the decode left the reference: {comparison:?}",
            self.what
        );
    }
}

/// One full decode on each path, run in lockstep: every forward pass is made on one path and
/// at once on the other, the first of the two alternating, so that the two passes of a pair
/// see the same moment of a shared machine. Returns `(direct, service)` per forward pass.
fn lockstep<D: Ops, S: Ops>(
    direct: &mut Decoder<'_, '_, D>,
    service: &mut Decoder<'_, '_, S>,
    reference: &Reference,
    what: &str,
    service_first: bool,
) -> Vec<(Span, Span)> {
    let mut d = Run::new(direct, reference, format!("{what}, direct"));
    let mut s = Run::new(service, reference, format!("{what}, service"));
    let passes = reference.prompt.len() - 1 + reference.tokens.len();
    let pairs = (0..passes)
        .map(|i| {
            if (i % 2 == 0) == service_first {
                let service = s.forward(i, reference);
                (d.forward(i, reference), service)
            } else {
                let direct = d.forward(i, reference);
                (direct, s.forward(i, reference))
            }
        })
        .collect();
    d.check(reference);
    s.check(reference);
    pairs
}

/// The stored bytes of the weights one forward pass reads.
#[derive(Debug, Clone, Copy)]
struct WeightBytes {
    /// Every layer's matrices and norm vectors.
    layers: u64,
    /// The output norm and the output matrix (the embedding table when tied).
    output: u64,
    /// One row of the token embedding.
    embedding_row: u64,
    /// `rope_freqs.weight`, when the model has it.
    other: u64,
}

impl WeightBytes {
    fn of(model: &dyn ModelFile, cfg: &Config) -> WeightBytes {
        let mut w = WeightBytes {
            layers: 0,
            output: 0,
            embedding_row: 0,
            other: 0,
        };
        for (i, t) in model.tensors().iter().enumerate() {
            let bytes = model
                .tensor_data(i)
                .unwrap_or_else(|e| panic!("reading tensor {}: {e}", t.name))
                .len() as u64;
            match t.name.as_str() {
                name if name.starts_with("blk.") => w.layers += bytes,
                "output.weight" | "output_norm.weight" => w.output += bytes,
                "token_embd.weight" => {
                    w.embedding_row = bytes / cfg.n_vocab as u64;
                    if cfg.tied_embeddings {
                        w.output += bytes;
                    }
                }
                _ => w.other += bytes,
            }
        }
        w
    }

    fn total(&self) -> u64 {
        self.layers + self.output + self.embedding_row + self.other
    }
}

/// The last-level data cache of cpu 0 from sysfs: its level and size in bytes.
fn last_level_cache() -> Option<(u32, u64)> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    let read = |p: &Path, f: &str| std::fs::read_to_string(p.join(f)).ok();
    let mut best: Option<(u32, u64)> = None;
    for entry in dir.flatten() {
        let p = entry.path();
        if read(&p, "type").is_some_and(|t| t.trim() == "Instruction") {
            continue;
        }
        let Some(level) = read(&p, "level").and_then(|l| l.trim().parse::<u32>().ok()) else {
            continue;
        };
        let Some(size) = read(&p, "size").and_then(|s| {
            let s = s.trim();
            let (n, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
                Some((i, _)) => (&s[..i], &s[i..]),
                None => (s, ""),
            };
            let n: u64 = n.parse().ok()?;
            match unit {
                "" => Some(n),
                "K" => Some(n << 10),
                "M" => Some(n << 20),
                "G" => Some(n << 30),
                _ => None,
            }
        }) else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, size));
        }
    }
    best
}

/// Sums `words` in eight independent lanes, so that the loop is bounded by the loads, not by
/// the latency of one chain of additions (integers: the compiler may vectorise it freely).
#[inline(never)]
fn sum_words(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let chunks = words.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, w) in lanes.iter_mut().zip(chunk) {
            *lane = lane.wrapping_add(*w);
        }
    }
    lanes
        .iter()
        .chain(rest)
        .fold(0u64, |a, &b| a.wrapping_add(b))
}

/// One pass over `words`, read whole: the seconds it took on both clocks.
fn read_pass(words: &[u64]) -> Span {
    timed(|| black_box(sum_words(black_box(words)))).1
}

/// The load average, to print beside the figures (timings taken while others build are
/// inflated).
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The CPU's model name and whether it has AVX2 and FMA, from /proc/cpuinfo.
fn cpu() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    };
    let flags = field("flags").unwrap_or_default();
    let has = |f: &str| match flags.split_whitespace().any(|x| x == f) {
        true => "yes",
        false => "no",
    };
    format!(
        "{} (avx2 {}, fma {})",
        field("model name").unwrap_or_else(|| "unknown".into()),
        has("avx2"),
        has("fma")
    )
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    match v.len() % 2 {
        0 => (v[mid - 1] + v[mid]) / 2.0,
        _ => v[mid],
    }
}

fn range(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// One decode measured: a model in one dtype on one set of providers, both ways.
struct Row {
    dtype: &'static str,
    /// The index of its model.
    model: usize,
    providers: &'static str,
    /// The matvec implementations the service resolved (one per distinct matrix dtype).
    matvec: String,
    /// `(direct, service)` seconds of each forward pass, every pass of every round.
    pairs: Vec<(Span, Span)>,
    /// The method's own difference: `(direct, second direct)` for each forward pass, the same
    /// calls made by two decoders in lockstep exactly as the service is compared (an A/A run).
    twins: Vec<(Span, Span)>,
}

impl Row {
    /// Tokens (forward passes) per second on one clock, direct and through the service: the
    /// median pass.
    fn tokens_per_second(&self, clock: fn(&Span) -> f64) -> (f64, f64) {
        let direct: Vec<f64> = self.pairs.iter().map(|(d, _)| clock(d)).collect();
        let service: Vec<f64> = self.pairs.iter().map(|(_, s)| clock(s)).collect();
        (1.0 / median(&direct), 1.0 / median(&service))
    }

    /// The host's share of each pair's time on one clock: `(service - direct) / service`.
    fn shares(&self, clock: fn(&Span) -> f64) -> Vec<f64> {
        Self::differences(&self.pairs, clock)
    }

    /// What the same comparison gives between two decoders that both call the providers
    /// directly: the share a difference without any host in it shows.
    fn twin_shares(&self, clock: fn(&Span) -> f64) -> Vec<f64> {
        Self::differences(&self.twins, clock)
    }

    fn differences(pairs: &[(Span, Span)], clock: fn(&Span) -> f64) -> Vec<f64> {
        pairs
            .iter()
            .map(|(a, b)| (clock(b) - clock(a)) / clock(b))
            .collect()
    }
}

/// The median of `values` and a 95% interval for it that assumes nothing of their
/// distribution (the order statistics of ranks `n/2 -+ 0.98 sqrt(n)`, counted from 1), taking
/// the values as independent.
fn median_interval(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let half = 0.98 * n.sqrt();
    // The lower rank, counted from 1, is floor(n/2 - half); as an index, one less.
    let lo = ((n / 2.0 - half).floor() - 1.0).max(0.0) as usize;
    let hi = ((n / 2.0 + half).ceil() as usize).min(v.len() - 1);
    (median(&v), v[lo], v[hi])
}

/// The service's own cost per call, measured apart from the arithmetic: `example.llama.add`
/// on 16 values (the smallest call the decode makes costs microseconds; this one tens of
/// nanoseconds), `CALLS` executes through the service as the decode makes them and `CALLS` bare
/// calls of the provider's execute through one argument record built beforehand, timed on the
/// thread's CPU clock, their order alternating, over `rounds` rounds. Returns each round's
/// difference per call in seconds.
fn per_call_overhead(service: &Traced<'_>, direct: &Direct, rounds: usize) -> Vec<f64> {
    const CALLS: u32 = 20_000;
    let desc = TensorDesc::new(DType::F32, &[16], MemorySpace::Host);
    let descs = [desc, desc];
    let outs = [desc];
    let on_service = service
        .resolve("example.llama.add", &descs, &outs)
        .expect("resolve example.llama.add (service)");
    let on_direct = direct
        .resolve("example.llama.add", &descs, &outs)
        .expect("resolve example.llama.add (direct)");
    let (a, b) = (vec![1.0f32; 16], vec![2.0f32; 16]);
    let mut y = vec![0.0f32; 16];
    let mut time = |ops: &dyn Fn(&mut [f32])| {
        let start = Stamp::now();
        for _ in 0..CALLS {
            ops(black_box(&mut y));
        }
        start.to(Stamp::now()).cpu / f64::from(CALLS)
    };
    let through_service = |y: &mut [f32]| {
        service
            .execute(
                &on_service,
                &[In::F32(&a), In::F32(&b)],
                &mut [Out::F32(y)],
                &[],
            )
            .expect("execute example.llama.add (service)")
    };
    let mut bare = vec![0.0f32; 16];
    let mut time_bare = || {
        let start = Stamp::now();
        on_direct.call_repeatedly(&[&a, &b], &mut bare, CALLS);
        start.to(Stamp::now()).cpu / f64::from(CALLS)
    };
    // Warm both paths once.
    time(&through_service);
    time_bare();
    (0..rounds)
        .map(|round| {
            if round % 2 == 0 {
                let s = time(&through_service);
                s - time_bare()
            } else {
                let d = time_bare();
                time(&through_service) - d
            }
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let rounds: usize = match args.iter().position(|a| a == "--rounds") {
        Some(i) => args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .filter(|&n| n > 0)
            .expect("--rounds takes a positive number"),
        None if full => 7,
        None => 1,
    };
    let shape: &[&str] = if full { &SHAPE } else { &[] };
    let passes_per_round = if full { 3 } else { 1 };

    println!(
        "\ndecode against the memory-bandwidth bound{}",
        if full {
            ""
        } else {
            ": test mode, the 2-layer tiny model once per path; the figures are not measurements"
        }
    );
    println!("cpu: {}; load average at the start: {}", cpu(), load());

    // The providers: the portable module alone, and with the AVX2 module beside it where it
    // was built.
    let avx2_path = plugin_dir().join(format!("lib{}.so", AVX2.library));
    let mut sets = vec![Providers {
        name: "portable",
        modules: vec![&PORTABLE],
    }];
    let mut skipped = Vec::new();
    if avx2_path.exists() {
        sets.push(Providers {
            name: "portable + avx2",
            modules: vec![&PORTABLE, &AVX2],
        });
    } else {
        skipped.push(format!(
            "portable + avx2: skipped, {} does not exist (`cargo xtask plugins` builds it where \
             test-plugins has the AVX2 module)",
            avx2_path.display()
        ));
    }
    let shop = Workshop::new();
    let mut hosts = Vec::new();
    // Every set that was built must install: a library that exists but is refused is a broken
    // package (ids out of step with its manifest template, say), not a row to skip.
    for set in &sets {
        match host_with(&shop, &set.modules) {
            Ok(host) => hosts.push((set.name, host)),
            Err(e) => panic!("the {} modules: {e}", set.name),
        }
    }

    // The models, read once each through the first host's reader (the file is the same for
    // every store).
    let mut models: Vec<(&'static str, Arc<dyn ModelFile>, Config, Reference)> = Vec::new();
    for dtype in DTYPES {
        let dir = shop.fresh(&format!("model-{dtype}"));
        let start = Instant::now();
        make_model(&dir, dtype, shape);
        let reference =
            Reference::read(&dir.join("tiny-llama.reference.json")).expect("the reference");
        let model = hosts[0]
            .1
            .models()
            .read_file(&dir.join("tiny-llama.gguf"))
            .expect("the host reads the model");
        let cfg = Config::from_model(model.as_ref()).expect("a llama");
        println!(
            "model {dtype}: written and its reference computed in {:.1} s",
            start.elapsed().as_secs_f64()
        );
        models.push((dtype, model, cfg, reference));
    }
    let cfg = models[0].2;
    println!(
        "model: {} layers, hidden {}, {} query heads sharing {} key/value heads of {}, \
         feed-forward {}, vocabulary {}, context {}; {} prompt tokens and {} decoded, {} forward \
         passes per decode",
        cfg.n_layer,
        cfg.n_embd,
        cfg.n_head,
        cfg.n_head_kv,
        cfg.head_dim,
        cfg.n_ff,
        cfg.n_vocab,
        cfg.n_ctx,
        models[0].3.prompt.len(),
        models[0].3.tokens.len(),
        models[0].3.prompt.len() - 1 + models[0].3.tokens.len(),
    );

    // Every path of every row, each with its own handles for the whole run.
    struct Paths<'h> {
        dtype: &'static str,
        providers: &'static str,
        model: usize,
        service: Traced<'h>,
        direct: Direct,
        twin: Direct,
    }
    let mut paths = Vec::new();
    for (m, &(dtype, ..)) in models.iter().enumerate() {
        for (name, host) in &hosts {
            paths.push(Paths {
                dtype,
                providers: name,
                model: m,
                service: Traced {
                    service: Service::new(OperationService::new(host.kernels())),
                    resolved: RefCell::new(Vec::new()),
                    calls: Cell::new(0),
                },
                direct: Direct::new(*host.kernels().operation_api()),
                twin: Direct::new(*host.kernels().operation_api()),
            });
        }
    }
    let mut decoders = Vec::new();
    let mut rows = Vec::new();
    for p in &paths {
        let (_, model, cfg, _) = &models[p.model];
        let weights = || Weights::from_model(model, cfg).expect("the model's weights");
        let service = Decoder::new(*cfg, weights(), &p.service).expect("resolve (service)");
        let direct = Decoder::new(*cfg, weights(), &p.direct).expect("resolve (direct)");
        let twin = Decoder::new(*cfg, weights(), &p.twin).expect("resolve (second direct)");
        // Like for like: the direct calls run the implementations the service resolved.
        let resolved = p.service.resolved.borrow().clone();
        assert_eq!(
            resolved,
            p.direct.resolved(),
            "{} {}: the service and the direct calls resolved different implementations",
            p.dtype,
            p.providers
        );
        let mut matvec: Vec<String> = resolved
            .into_iter()
            .filter(|(op, _)| op == MATVEC)
            .map(|(_, id)| id)
            .collect();
        matvec.sort();
        matvec.dedup();
        rows.push(Row {
            dtype: p.dtype,
            model: p.model,
            providers: p.providers,
            matvec: matvec.join(", "),
            pairs: Vec::new(),
            twins: Vec::new(),
        });
        decoders.push((service, direct, twin));
    }

    // The streaming read: 8 times the last-level cache, so that at most an eighth of a pass
    // could be served from it, and at least 256 MiB, so that a pass takes tens of milliseconds.
    let llc = last_level_cache();
    let buffer_bytes: u64 = match (full, llc) {
        (false, _) => 8 << 20,
        (true, Some((_, size))) => (8 * size).max(256 << 20),
        (true, None) => 1 << 30,
    };
    let words: Vec<u64> = (0..buffer_bytes / 8).collect();
    read_pass(&words);
    let mut reads = Vec::new();

    // Untimed warm-up: every path once (page faults on the model's mapping, first calls).
    for ((service, direct, twin), row) in decoders.iter_mut().zip(&rows) {
        let what = format!("{} {}", row.dtype, row.providers);
        lockstep(direct, service, &models[row.model].3, &what, false);
        lockstep(
            direct,
            twin,
            &models[row.model].3,
            &format!("{what} A/A"),
            false,
        );
    }
    let calls_before: Vec<u64> = paths.iter().map(|p| p.service.calls.get()).collect();
    for round in 0..rounds {
        for _ in 0..passes_per_round {
            reads.push(read_pass(&words));
        }
        for ((service, direct, twin), row) in decoders.iter_mut().zip(&mut rows) {
            let what = format!("{} {}", row.dtype, row.providers);
            // Each position's pair runs in both orders over two rounds.
            let pairs = lockstep(direct, service, &models[row.model].3, &what, round % 2 == 1);
            row.pairs.extend(pairs);
            let reference = &models[row.model].3;
            let twins = lockstep(
                direct,
                twin,
                reference,
                &format!("{what} A/A"),
                round % 2 == 1,
            );
            row.twins.extend(twins);
        }
    }
    let calls_per_pass: Vec<f64> = paths
        .iter()
        .zip(&calls_before)
        .zip(&rows)
        .map(|((p, before), row)| (p.service.calls.get() - before) as f64 / row.pairs.len() as f64)
        .collect();
    // The host's cost per call, on the first store (every store runs the same host code).
    let overhead = median_interval(&per_call_overhead(
        &paths[0].service,
        &paths[0].direct,
        if full { 21 } else { 3 },
    ));
    let load_after = load();
    drop(decoders);

    // The figures are on the thread's CPU time: on a machine shared with other work, the
    // wall clock also counts the time they had the core, which comes and goes between
    // rounds. The wall-clock figures are printed beside them; on an idle machine the two agree.
    let cpu = |s: &Span| s.cpu;
    let wall = |s: &Span| s.wall;
    let rate_of = |clock: fn(&Span) -> f64| {
        let rates: Vec<f64> = reads
            .iter()
            .map(|r| buffer_bytes as f64 / clock(r))
            .collect();
        let (lo, hi) = range(&rates);
        (median(&rates), lo, hi)
    };
    let (rate, rate_lo, rate_hi) = rate_of(cpu);
    let (rate_wall, ..) = rate_of(wall);
    println!(
        "streaming read, one thread (a sum of u64 over {} MiB, {}): median {:.2} GB/s over {} \
         passes (range {:.2} to {:.2}; {:.2} GB/s on the wall clock)",
        buffer_bytes >> 20,
        match (full, llc) {
            (false, _) => "test mode".to_owned(),
            (true, Some((level, size))) => format!(
                "8 x the {} MiB L{level} cache, at least 256 MiB",
                size >> 20
            ),
            (true, None) => "the last-level cache unknown".to_owned(),
        },
        rate / 1e9,
        reads.len(),
        rate_lo / 1e9,
        rate_hi / 1e9,
        rate_wall / 1e9
    );
    let bounds: Vec<f64> = models
        .iter()
        .map(|(dtype, model, cfg, _)| {
            let w = WeightBytes::of(model.as_ref(), cfg);
            let bound = rate / w.total() as f64;
            println!(
                "weights per token, {dtype}: {:.2} MB ({:.2} MB layers, {:.2} MB output norm and \
                 matrix, {} B embedding row{}); bound {bound:.1} tokens/s",
                w.total() as f64 / 1e6,
                w.layers as f64 / 1e6,
                w.output as f64 / 1e6,
                w.embedding_row,
                match w.other {
                    0 => String::new(),
                    n => format!(", {n} B other"),
                },
            );
            bound
        })
        .collect();
    // The attention of the last forward pass reads every cached position's key and value.
    let steps = models[0].3.prompt.len() - 1 + models[0].3.tokens.len();
    let kv_bytes = (cfg.n_layer * 2 * cfg.n_head_kv * cfg.head_dim * 4 * steps) as u64;
    println!(
        "(the key/value cache the attention reads, at most {:.0} KB a token here, is not \
         counted; where a token's weights are not much larger than the last-level cache{}, part \
         of them may come from it and the bound is not a hard one)",
        kv_bytes as f64 / 1e3,
        match llc {
            Some((_, size)) => format!(" ({} MiB)", size >> 20),
            None => String::new(),
        }
    );
    for line in &skipped {
        println!("{line}");
    }
    println!(
        "\n  {:<6}{:<17}{:>13}{:>14}{:>10}{:>12}{:>20}{:>10}{:>20}{:>24}  matvec resolved to",
        "dtype",
        "providers",
        "direct tok/s",
        "service tok/s",
        "of bound",
        "host share",
        "(95% interval)",
        "A/A",
        "(95% interval)",
        "wall: direct / service",
    );
    let mut summary = Vec::new();
    for row in &rows {
        let (direct, service) = row.tokens_per_second(cpu);
        let (direct_wall, service_wall) = row.tokens_per_second(wall);
        let fraction = service / bounds[row.model];
        let (share, lo, hi) = median_interval(&row.shares(cpu));
        let twin = median_interval(&row.twin_shares(cpu));
        println!(
            "  {:<6}{:<17}{:>13.1}{:>14.1}{:>10.3}{:>11.3}%{:>9.3}% to {:>6.3}%{:>9.3}%{:>9.3}% to \
             {:>6.3}%{:>13.1} /{:>8.1}  {}",
            row.dtype,
            row.providers,
            direct,
            service,
            fraction,
            share * 100.0,
            lo * 100.0,
            hi * 100.0,
            twin.0 * 100.0,
            twin.1 * 100.0,
            twin.2 * 100.0,
            direct_wall,
            service_wall,
            row.matvec
        );
        summary.push((row, service, fraction, (share, lo, hi), twin));
    }
    println!(
        "  tokens/s: forward passes per second of the thread's CPU time, the median pass of {} \
         ({rounds} round(s)); of bound: the service's tokens/s over the bound; host share: \
         (service - direct) / service of each pair of passes run back to back, the median; A/A: \
         the same for two decoders that both call the providers directly, what the comparison \
         shows with no host in it; wall: tokens/s on the wall clock",
        rows.first().map_or(0, |r| r.pairs.len()),
    );
    println!(
        "the service's own cost per call: {:+.1} ns over the direct call (95% interval {:+.1} to \
         {:+.1} ns; example.llama.add on 16 values, 20,000 calls each way per round, the median \
         round; the direct call is the provider's execute on argument records built once)",
        overhead.0 * 1e9,
        overhead.1 * 1e9,
        overhead.2 * 1e9
    );
    // Per row: that cost times the calls a forward pass makes, over the service's time per pass.
    let per_call_shares: Vec<(&Row, f64, f64, f64)> = rows
        .iter()
        .zip(&calls_per_pass)
        .map(|(row, calls)| {
            let (_, service) = row.tokens_per_second(cpu);
            let share = |per_call: f64| per_call * calls * service;
            (row, *calls, share(overhead.0), share(overhead.2))
        })
        .collect();
    for (row, calls, share, hi) in &per_call_shares {
        println!(
            "  {:<6}{:<17} {calls:.1} calls a pass: the host's cost {:.4}% of a pass (upper end \
             {:.4}%)",
            row.dtype,
            row.providers,
            share * 100.0,
            hi * 100.0
        );
    }
    println!("load average after the decodes: {load_after}");
    if !full {
        return;
    }
    if let Some((row, tps, fraction, ..)) = summary
        .iter()
        .filter(|(row, ..)| row.dtype == "q8_0")
        .max_by(|a, b| a.1.total_cmp(&b.1))
    {
        println!(
            "verdict, q8_0 with the faster provider ({}, {}): {tps:.1} tokens/s through the \
             service, {fraction:.3} of the bound: goal at least 0.5: {}",
            row.providers,
            row.matvec,
            if *fraction >= 0.5 { "met" } else { "not met" }
        );
    }
    // The goal fails where a row's interval lies above 1% and the same comparison of the direct
    // calls with themselves (A/A) reaches less far; a row above 1% whose A/A reaches as far
    // leaves it open (the difference may be the method's: where each decoder's buffers lie, the
    // order of a pair), and so does an A/A that reaches 1% where every row lies below it.
    let reach = |(_, lo, hi): &(f64, f64, f64)| lo.abs().max(hi.abs());
    let over = summary
        .iter()
        .find(|(_, _, _, (_, lo, _), twin)| *lo >= 0.01 && reach(twin) < *lo);
    let excused = summary.iter().find(|(_, _, _, (_, lo, _), _)| *lo >= 0.01);
    let open = summary.iter().find(|(_, _, _, (_, _, hi), _)| *hi >= 0.01);
    let twin_open = summary.iter().find(|(.., twin)| reach(twin) >= 0.01);
    let verdict = match (over, excused, open, twin_open) {
        (Some((row, _, _, (share, lo, hi), _)), ..) => format!(
            "not met: {} {} takes {:.3}% (95% interval {:.3}% to {:.3}%)",
            row.dtype,
            row.providers,
            share * 100.0,
            lo * 100.0,
            hi * 100.0
        ),
        (None, Some((row, _, _, (share, lo, hi), (twin, twin_lo, twin_hi))), ..) => format!(
            "not decided: {} {} takes {:.3}% (95% interval {:.3}% to {:.3}%), but two decoders \
             that both call the providers directly differ by {:.3}% ({:.3}% to {:.3}%) in the \
             same comparison, so a difference of this size is not the host's",
            row.dtype,
            row.providers,
            share * 100.0,
            lo * 100.0,
            hi * 100.0,
            twin * 100.0,
            twin_lo * 100.0,
            twin_hi * 100.0
        ),
        (None, None, None, Some((row, _, _, _, (twin, twin_lo, twin_hi)))) => format!(
            "not decided: every row's interval lies below 1%, but in {} {} two decoders that both \
             call the providers directly differ by {:.3}% ({:.3}% to {:.3}%), so a share near 1% \
             could hide in the method's own difference",
            row.dtype,
            row.providers,
            twin * 100.0,
            twin_lo * 100.0,
            twin_hi * 100.0
        ),
        (None, None, Some((row, _, _, (share, lo, hi), _)), _) => format!(
            "not decided at this noise: {} {} takes {:.3}%, its 95% interval {:.3}% to {:.3}% \
             spans 1%",
            row.dtype,
            row.providers,
            share * 100.0,
            lo * 100.0,
            hi * 100.0
        ),
        (None, None, None, None) => {
            let by = |key: fn(&(f64, f64, f64)) -> f64| {
                summary
                    .iter()
                    .max_by(|a, b| key(&a.3).total_cmp(&key(&b.3)))
                    .map(|(row, _, _, shares, _)| (row.dtype, row.providers, key(shares) * 100.0))
                    .expect("a row")
            };
            let (median_row, upper_row) = (by(|s| s.0), by(|s| s.2));
            format!(
                "met: every row's 95% interval lies below 1% (the largest median {:.3}%, {} {}; \
                 the highest upper end {:.3}%, {} {})",
                median_row.2, median_row.0, median_row.1, upper_row.2, upper_row.0, upper_row.1
            )
        }
    };
    let (worst, _, _, worst_hi) = per_call_shares
        .iter()
        .max_by(|a, b| a.3.total_cmp(&b.3))
        .expect("a row");
    println!(
        "verdict, the host's share per token, goal under 1%: {}: at most {:.4}% of a pass (the \
         upper end of the per-call cost times the calls a pass makes; {} {})",
        if *worst_hi < 0.01 { "met" } else { "not met" },
        worst_hi * 100.0,
        worst.dtype,
        worst.providers
    );
    println!("cross-check, the whole passes compared in lockstep: {verdict}");
}
