//! guild-llama-decode: decodes a Llama-architecture GGUF greedily through the operation service
//! of a Guild store, with the `example.llama.*` operations some installed module provides.
//!
//! Usage: guild-llama-decode STORE MODEL [--reference FILE] [--tokens N] [--prompt T,T,...]
//!
//! With `--reference` (the JSON `make_tiny_llama.py` writes) the prompt and the count come from
//! the reference, and the run fails unless the tokens equal the reference's and every logit is
//! within the stated tolerance.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use guild_host::{Host, OpenedHost, OperationService};
use guild_llama_decode::{generate, Config, Decoder, Reference, Service, Weights, LOGIT_TOLERANCE};

struct Args {
    store: PathBuf,
    model: PathBuf,
    reference: Option<PathBuf>,
    tokens: usize,
    prompt: Vec<u32>,
}

const USAGE: &str =
    "usage: guild-llama-decode STORE MODEL [--reference FILE] [--tokens N] [--prompt T,T,...]";

fn parse_args() -> Result<Args, String> {
    let mut positional = Vec::new();
    let mut args = Args {
        store: PathBuf::new(),
        model: PathBuf::new(),
        reference: None,
        tokens: 16,
        prompt: vec![1],
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
    println!(
        "model {}: llama, {} layers, hidden {}, {} heads ({} key/value), feed-forward {}, \
         vocabulary {}, context {}",
        args.model.display(),
        cfg.n_layer,
        cfg.n_embd,
        cfg.n_head,
        cfg.n_head_kv,
        cfg.n_ff,
        cfg.n_vocab,
        cfg.n_ctx
    );
    let weights = Weights::from_model(&model, &cfg).map_err(|e| e.to_string())?;
    let ops = Service::new(OperationService::new(host.kernels()));
    let mut decoder = Decoder::new(cfg, weights, &ops).map_err(|e| e.to_string())?;
    let prompt: Vec<String> = args.prompt.iter().map(u32::to_string).collect();
    println!("prompt: {}", prompt.join(" "));

    let start = Instant::now();
    let generation =
        generate(&mut decoder, &args.prompt, args.tokens).map_err(|e| e.to_string())?;
    let elapsed = start.elapsed();
    let counts = decoder.counts();
    let tokens: Vec<String> = generation.tokens.iter().map(u32::to_string).collect();
    println!("tokens: {}", tokens.join(" "));
    println!(
        "{} forward passes in {:.2} ms: {:.0} tokens/s; {:.0} operation calls per token, {} \
         re-binds of the attention to the grown cache",
        counts.steps,
        elapsed.as_secs_f64() * 1e3,
        counts.steps as f64 / elapsed.as_secs_f64(),
        counts.calls as f64 / counts.steps as f64,
        counts.rebinds
    );
    let Some(reference) = reference else {
        return Ok(true);
    };
    let c = reference.compare(&generation);
    println!(
        "reference: tokens {}; largest logit error {:.2e} (tolerance {LOGIT_TOLERANCE:.0e} \
         relative to max(1, |logit|)); smallest top-2 margin {:.3}",
        if c.tokens_match { "match" } else { "DIFFER" },
        c.max_logit_error,
        reference.min_top2_margin
    );
    Ok(c.matches())
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
