//! Benchmark support for idempo (bodies are generated in the bench targets).
