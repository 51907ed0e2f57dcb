-- wrk script of `make bench-e2e`:
--   wrk ... -s load.lua <url> -- fresh <key prefix> <JSON body>   a new Idempotency-Key per request
--   wrk ... -s load.lua <url> -- replay <key> <JSON body>         one completed key on every request
--                                                                 (the harness sends it once first)
-- Prints one JSON line when done (requests, duration, p50/p99 latency, answers >= 400, socket
-- errors and timeouts).
local fresh, prefix, body, n, fixed = true, "k", "{}", 0, nil
local headers = { ["Content-Type"] = "application/json" }

function init(args)
  fresh = args[1] ~= "replay"
  prefix = args[2] or prefix
  body = args[3] or body
  if not fresh then
    headers["Idempotency-Key"] = prefix
    fixed = wrk.format("POST", nil, headers, body)
  end
end

function request()
  if fixed then
    return fixed
  end
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
