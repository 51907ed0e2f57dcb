-- wrk script of `make bench-e2e`:
--   wrk ... -s load.lua <url> -- fresh <key prefix> <JSON body>   a new Idempotency-Key per request
--   wrk ... -s load.lua <url> -- replay <key> <JSON body>         one completed key on every request
--                                                                 (the harness sends it once first)
-- Prints one JSON line when done (requests, duration, p50/p99 latency, answers >= 400, socket
-- errors and timeouts).
--
-- Fresh requests are the request wrk.format builds once, cut at the key: each request is then
-- one string concatenation, so wrk's own cost per request stays small beside the server's.
local head, tail, n, fixed = "", "", 0, nil

function init(args)
  local fresh = args[1] ~= "replay"
  local key, body = args[2] or "k", args[3] or "{}"
  local marker = "\1KEY\1"
  local headers = {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = fresh and marker or key,
  }
  local req = wrk.format("POST", nil, headers, body)
  if fresh then
    local at = req:find(marker, 1, true)
    head = req:sub(1, at - 1) .. key .. "-"
    tail = req:sub(at + #marker)
  else
    fixed = req
  end
end

function request()
  if fixed then
    return fixed
  end
  n = n + 1
  return head .. n .. tail
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"non2xx":%d,"errors":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
