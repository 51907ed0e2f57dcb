"""Shared helpers for the evidence suites: a small HTTP/1.1 client, throwaway services and
uvicorn server processes. Standard library only (plus the repository's idempo package)."""
