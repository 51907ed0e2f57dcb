-- wrk script of `make bench-e2e`, replay mode: every request repeats one completed key (the
-- harness sends it once before the run), so each answer is a stored one.
--   wrk ... -s replay.lua <url> -- <key> <JSON body>
local req

function init(args)
  req = wrk.format("POST", nil, { ["Content-Type"] = "application/json", ["Idempotency-Key"] = args[1] },
    args[2])
end

function request()
  return req
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"non2xx":%d,"errors":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
