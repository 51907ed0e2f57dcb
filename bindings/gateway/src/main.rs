//! The `idempo-gateway` command: `check-config FILE`, `serve --config FILE`, `--help`,
//! `--version`.
use std::path::PathBuf;
use std::process::ExitCode;

use idempo_gateway::config::{GatewayConfig, LoadError};

const USAGE: &str = "usage: idempo-gateway check-config FILE
       idempo-gateway serve --config FILE
       idempo-gateway --help | --version";

const HELP: &str = "idempo-gateway: the idempotency protocol in front of any HTTP service.

  check-config FILE     validate a configuration; prints OK (exit 0) or each error as
                        file:line:column (exit 1; 2 when the file cannot be read)
  serve --config FILE   run the gateway; SIGTERM or SIGINT finish in-flight requests, then stop
  --help, -h            this text
  --version, -V         the version

Configuration reference: bindings/gateway/README.md";

fn load(path: &str) -> Result<GatewayConfig, ExitCode> {
    match GatewayConfig::load(&PathBuf::from(path)) {
        Ok(c) => Ok(c),
        Err(e @ LoadError::Read { .. }) => {
            eprintln!("{e}");
            Err(ExitCode::from(2))
        }
        Err(e @ LoadError::Invalid(_)) => {
            eprintln!("{e}");
            Err(ExitCode::from(1))
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["--help" | "-h" | "help"] => {
            println!("{USAGE}\n\n{HELP}");
            ExitCode::SUCCESS
        }
        ["--version" | "-V"] => {
            println!("idempo-gateway {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        ["check-config", file] => match load(file) {
            Ok(_) => {
                println!("OK");
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        ["serve", "--config", file] | ["serve", "-c", file] => {
            let cfg = match load(file) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(idempo_gateway::run(cfg, idempo_gateway::shutdown::signal())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    idempo_gateway::log::error(&e, &[]);
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
