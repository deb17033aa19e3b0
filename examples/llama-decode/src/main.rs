//! guild-llama-decode: decodes a Llama-architecture GGUF greedily through the operation service
//! of a Guild store, with the `example.llama.*` operations some installed module provides.
//!
//! Usage: guild-llama-decode STORE MODEL [--reference FILE] [--tokens N] [--prompt T,T,...]
//!        [--decodes N] [--step]
//!
//! With `--reference` (the JSON `make_tiny_llama.py` writes) the prompt and the count come from
//! the reference, and the run fails unless the tokens equal the reference's and every logit is
//! within the stated tolerance.
//!
//! `--decodes N` runs the decode N times, as a serving runner does: it holds its handles for a
//! whole decode, and between decodes follows the store (`Host::refresh`); when a handle no
//! longer points at the version the store enables, it drops them, refreshes again (so that the
//! deferred switch happens) and resolves anew. `--step` reads one line on stdin before each
//! decoded token, so that a test can change the store at a known point of a decode.

use std::error::Error;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use guild_host::{Host, OpenedHost, OperationService, RefreshReport};
use guild_llama_decode::{
    generate_each, Config, Counts, Decoder, Reference, Service, Weights, LOGIT_TOLERANCE,
};

struct Args {
    store: PathBuf,
    model: PathBuf,
    reference: Option<PathBuf>,
    tokens: usize,
    prompt: Vec<u32>,
    decodes: usize,
    step: bool,
}

const USAGE: &str = "usage: guild-llama-decode STORE MODEL [--reference FILE] [--tokens N] \
                     [--prompt T,T,...] [--decodes N] [--step]";

const HELP: &str = "Decodes a Llama-architecture GGUF greedily through the operation service of a \
Guild store, with the example.llama.* operations an installed module provides.

  --reference FILE  take the prompt and the count from make_tiny_llama.py's JSON, and fail
                    unless the tokens and logits match it
  --tokens N        tokens to decode (default 16)
  --prompt T,T,...  the prompt's token ids (default 1)
  --decodes N       decode N times with the same handles, following the store between
                    decodes and resolving again when a handle is no longer current (default 1)
  --step            read one line on stdin before each decoded token (the tokens per
                    second then include the waits)";

fn parse_args() -> Result<Args, String> {
    let mut positional = Vec::new();
    let mut args = Args {
        store: PathBuf::new(),
        model: PathBuf::new(),
        reference: None,
        tokens: 16,
        prompt: vec![1],
        decodes: 1,
        step: false,
    };
    let mut it = std::env::args_os().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .and_then(|v| v.into_string().ok())
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))
        };
        match arg.to_str() {
            Some("--reference") => args.reference = Some(PathBuf::from(value("--reference")?)),
            Some("--tokens") => {
                args.tokens = value("--tokens")?
                    .parse()
                    .map_err(|e| format!("--tokens: {e}"))?
            }
            Some("--decodes") => {
                args.decodes = value("--decodes")?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or("--decodes needs a count of at least 1")?
            }
            Some("--step") => args.step = true,
            Some("--help" | "-h") => {
                println!("{USAGE}\n\n{HELP}");
                std::process::exit(0);
            }
            Some("--prompt") => {
                args.prompt = value("--prompt")?
                    .split(',')
                    .map(|t| t.trim().parse::<u32>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--prompt: {e}"))?
            }
            Some(flag) if flag.starts_with("--") => {
                return Err(format!("unknown option {flag}\n{USAGE}"))
            }
            _ => positional.push(PathBuf::from(arg)),
        }
    }
    let [store, model] = <[PathBuf; 2]>::try_from(positional).map_err(|_| USAGE.to_owned())?;
    args.store = store;
    args.model = model;
    Ok(args)
}

fn run() -> Result<bool, String> {
    let mut args = parse_args()?;
    let reference = match &args.reference {
        Some(path) => {
            let r = Reference::read(path)?;
            args.prompt = r.prompt.clone();
            args.tokens = r.tokens.len();
            Some(r)
        }
        None => None,
    };
    let OpenedHost { host, .. } = Host::builder(&args.store)
        .open()
        .map_err(|e| format!("{}: {e}", args.store.display()))?;
    let model = host
        .models()
        .read_file(&args.model)
        .map_err(|e| e.to_string())?;
    let cfg = Config::from_model(model.as_ref()).map_err(|e| e.to_string())?;
    // The weights are checked once here, so that a model this runner cannot take is refused
    // before any decode, naming the tensor.
    let stored = Weights::from_model(&model, &cfg)
        .map_err(|e| e.to_string())?
        .matrix_dtypes();
    let mut dtypes: Vec<String> = Vec::new();
    for (name, dtype) in &stored {
        if stored.iter().all(|(_, d)| d == dtype) {
            dtypes = vec![format!("{dtype}")];
            break;
        }
        dtypes.push(format!("{name} {dtype}"));
    }
    println!(
        "model {}: llama, {} layers, hidden {}, {} heads ({} key/value), feed-forward {}, \
         vocabulary {}, context {}, weight matrices {}; rope base {}{}{}{}",
        args.model.display(),
        cfg.n_layer,
        cfg.n_embd,
        cfg.n_head,
        cfg.n_head_kv,
        cfg.n_ff,
        cfg.n_vocab,
        cfg.n_ctx,
        dtypes.join(", "),
        cfg.rope_base,
        if cfg.rope_freq_scale == 1.0 {
            String::new()
        } else {
            format!(", linear scaling (freq_scale {})", cfg.rope_freq_scale)
        },
        if cfg.rope_freqs { ", rope_freqs" } else { "" },
        if cfg.tied_embeddings {
            ", tied embeddings"
        } else {
            ""
        }
    );
    let prompt: Vec<String> = args.prompt.iter().map(u32::to_string).collect();
    println!("prompt: {}", prompt.join(" "));
    let ops = Service::new(OperationService::new(host.kernels()));
    let mut control = args.step.then(|| std::io::stdin().lock());
    let mut all_match = true;
    let mut held: Option<Decoder<'_, '_, Service<'_>>> = None;
    for d in 1..=args.decodes {
        if let Some(decoder) = &held {
            // Between decodes: follow the store. Handles into a version that is no longer the
            // enabled one go with the decoder; the second refresh makes the switch that waited
            // for them, and the decoder is built anew on what the store enables now.
            refresh(&host);
            let bound = decoder.bound();
            if !bound.all_current() {
                println!("decode {}: {bound}: resolving again", d - 1);
                held = None;
                refresh(&host);
            }
        }
        let decoder = match &mut held {
            Some(decoder) => {
                decoder.restart();
                decoder
            }
            None => {
                let weights = Weights::from_model(&model, &cfg).map_err(|e| e.to_string())?;
                held.insert(Decoder::new(cfg, weights, &ops).map_err(|e| e.to_string())?)
            }
        };
        println!("decode {d}: {}", decoder.bound());
        wait(&mut control, d, 1)?;
        let before = decoder.counts();
        let mut calls = before.calls;
        let start = Instant::now();
        let generation = generate_each(decoder, &args.prompt, args.tokens, |decoder, i, token| {
            let now = decoder.counts().calls;
            println!(
                "decode {d} token {}: {token} ({} calls; {})",
                i + 1,
                now - calls,
                decoder.bound()
            );
            calls = now;
            if i + 1 < args.tokens {
                wait(&mut control, d, i + 2)?;
            }
            Ok::<(), Box<dyn Error>>(())
        })
        .map_err(|e| e.to_string())?;
        let elapsed = start.elapsed();
        let counts = since(before, decoder.counts());
        let tokens: Vec<String> = generation.tokens.iter().map(u32::to_string).collect();
        println!("decode {d} tokens: {}", tokens.join(" "));
        println!(
            "decode {d}: {} forward passes in {:.2} ms: {:.0} tokens/s; {:.0} operation calls per \
             token, {} re-binds of the attention to the grown cache",
            counts.steps,
            elapsed.as_secs_f64() * 1e3,
            counts.steps as f64 / elapsed.as_secs_f64(),
            counts.calls as f64 / counts.steps as f64,
            counts.rebinds
        );
        if let Some(reference) = &reference {
            let c = reference.compare(&generation);
            println!(
                "decode {d} reference: tokens {}; largest logit error {:.2e} (tolerance \
                 {LOGIT_TOLERANCE:.0e} relative to max(1, |logit|)); smallest top-2 margin {:.3}",
                if c.tokens_match { "match" } else { "DIFFER" },
                c.max_logit_error,
                reference.min_top2_margin
            );
            all_match &= c.matches();
        }
    }
    Ok(all_match)
}

/// What a decode did since `before`.
fn since(before: Counts, now: Counts) -> Counts {
    Counts {
        steps: now.steps - before.steps,
        calls: now.calls - before.calls,
        rebinds: now.rebinds - before.rebinds,
    }
}

/// With `--step`, waits for one line on stdin before token `token` of decode `decode`.
fn wait(
    control: &mut Option<std::io::StdinLock<'_>>,
    decode: usize,
    token: usize,
) -> Result<(), String> {
    let Some(input) = control else {
        return Ok(());
    };
    let mut line = String::new();
    match input.read_line(&mut line) {
        Ok(0) => Err(format!(
            "stdin closed before token {token} of decode {decode} (--step reads a line before \
             each token)"
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("reading stdin: {e}")),
    }
}

/// Follows the store, printing what changed in one line (a failure is a warning: the runner
/// goes on with what it has).
fn refresh(host: &Host) {
    match host.refresh() {
        Ok(r) => println!("{}", describe(&r)),
        Err(e) => eprintln!("warning: following the store failed: {e}"),
    }
}

fn describe(r: &RefreshReport) -> String {
    let mut parts = vec![format!(
        "generation {} -> {}",
        r.from_generation, r.generation
    )];
    parts.extend(
        r.loaded
            .iter()
            .map(|l| format!("loaded {}@{}", l.id, l.version)),
    );
    parts.extend(
        r.taken_out
            .iter()
            .map(|q| format!("took out {}@{} ({})", q.id, q.version, q.reason)),
    );
    parts.extend(r.deferred.iter().map(|d| format!("deferred: {d}")));
    parts.extend(r.revoked_live.iter().map(|v| {
        format!(
            "{} live handle(s) still run revoked {}@{}",
            v.bindings, v.id, v.version
        )
    }));
    parts.extend(
        r.failed
            .iter()
            .map(|(id, version, e)| format!("{id}@{version} failed to load: {e}")),
    );
    format!("refresh: {}", parts.join("; "))
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("guild-llama-decode: the decode does not match the reference");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("guild-llama-decode: {e}");
            ExitCode::from(2)
        }
    }
}
