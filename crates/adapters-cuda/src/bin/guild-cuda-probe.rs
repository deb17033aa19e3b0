//! `guild-cuda-probe`: says what the CUDA driver reports (or why there is no usable device),
//! and with `record <device> <stream>` records and waits for one work mark the way the host does
//! after a stream-ordered call. Exit status: 0 with a device, 2 without one, 1 on any other
//! failure. `cargo xtask gpu-check` runs it first so that a GPU machine's log names its GPU.

use std::process::ExitCode;

use guild_adapters_cuda::{CudaStreams, Driver};
use guild_ports::device::{StreamEvents, StreamRef};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let driver = match Driver::load() {
        Ok(driver) => driver,
        Err(e) => {
            println!("{e}");
            return if e.is_no_device() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            };
        }
    };
    match args.first().map(String::as_str) {
        None => describe(driver),
        Some("record") => record(driver, &args[1..]),
        Some(other) => {
            eprintln!("usage: guild-cuda-probe [record <device> <stream address>]; got {other:?}");
            ExitCode::FAILURE
        }
    }
}

fn describe(driver: Driver) -> ExitCode {
    let version = driver.version();
    println!(
        "CUDA driver {}.{} ({version})",
        version / 1000,
        (version % 1000) / 10
    );
    match driver.devices() {
        Ok(devices) => {
            for d in devices {
                println!(
                    "device {}: {}, compute capability {}.{} (sm {}), {} MiB",
                    d.ordinal,
                    d.name,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    d.sm,
                    d.total_memory >> 20
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{e}");
            if e.is_no_device() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn record(driver: Driver, args: &[String]) -> ExitCode {
    let parse = |s: Option<&String>| -> Option<u64> {
        let s = s?;
        match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => s.parse().ok(),
        }
    };
    let (Some(device), Some(stream)) = (parse(args.first()), parse(args.get(1))) else {
        eprintln!("usage: guild-cuda-probe record <device> <stream address>");
        return ExitCode::FAILURE;
    };
    let streams = CudaStreams::new(driver);
    let (Ok(device), Ok(stream)) = (i32::try_from(device), usize::try_from(stream)) else {
        eprintln!("device or stream out of range");
        return ExitCode::FAILURE;
    };
    match streams.record(device, StreamRef(stream)) {
        Ok(None) => println!("nothing to wait for: the stream is capturing"),
        Ok(Some(mark)) => {
            println!("recorded on stream {:#x}", mark.stream().0);
            match mark.wait() {
                Ok(()) => println!("waited"),
                Err(e) => {
                    println!("wait failed: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        Err(e) => {
            println!("record failed: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
