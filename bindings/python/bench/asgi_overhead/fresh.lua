-- A fresh Idempotency-Key per request (or one fixed key with KEY=replay), ~220-byte JSON body.
local counter = 0
local tid = 0
local fixed = os.getenv("KEY_MODE") == "replay"
function setup(thread) tid = tid + 1; thread:set("tid", tid) end
function init(args) math.randomseed(os.time() + (tid or 0)) ; prefix = tostring(math.random(1, 1e9)) end
wrk.method = "POST"
wrk.body = '{"amount":1250,"currency":"EUR","customer":"cus_0123456789abcdef","description":"Order 4711: two tickets, one voucher, express delivery","metadata":{"channel":"web","campaign":"winter-2026","ref":"a1b2c3d4e5f6"}}'
wrk.headers["Content-Type"] = "application/json"
function request()
  counter = counter + 1
  local key = fixed and "replay-key-1" or (prefix .. "-" .. counter)
  wrk.headers["Idempotency-Key"] = key
  return wrk.format()
end
