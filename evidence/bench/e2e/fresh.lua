-- wrk script of `make bench-e2e`, fresh mode: a new Idempotency-Key on every request.
--   wrk ... -s fresh.lua <url> -- <key prefix> <JSON body>
-- Prints one JSON line when done (requests, duration, p50/p99 latency, non-2xx and socket errors).
local prefix, body, n = "k", "{}", 0
local headers = { ["Content-Type"] = "application/json" }

function init(args)
  prefix = args[1] or prefix
  body = args[2] or body
end

function request()
  n = n + 1
  headers["Idempotency-Key"] = prefix .. "-" .. n
  return wrk.format("POST", nil, headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"non2xx":%d,"errors":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
