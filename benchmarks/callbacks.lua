-- wrk's script for benchmarks/callbacks.py: the events of events() there, vendor-shaped
-- (distinct references and event ids), each message's echo, DELIVERED and READ WINDOW
-- messages apart; thread t of THREADS sends messages t, t+THREADS, ... (MESSAGES in all).
-- Each thread writes "done" once all its events are answered (wrk itself runs until its
-- -d or a SIGINT), and "answered N" every PROGRESS answers; done() writes one JSON line.
local MESSAGES = tonumber(os.getenv("CB_MESSAGES") or "100000")
local WINDOW = tonumber(os.getenv("CB_WINDOW") or "1000")
local THREADS = tonumber(os.getenv("CB_THREADS") or "1")
local PROGRESS = 1000
local STEPS = { {"outbound", "basic"}, {"inbound", "DELIVERED"}, {"inbound", "READ"} }
local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  mine = math.floor((MESSAGES - tid + THREADS - 1) / THREADS) -- messages of this thread
  slot, step, acked, refused = 0, 0, 0, 0
  verifying = tid == 0 -- wrk calls the first thread's request() once to check it, unsent
  wrk.headers["Content-Type"] = "application/json"
end

local base = 1719835200
local function body(index, s)
  local reference = string.format("00000000-0000-4000-8000-%012d", index)
  local moment = os.date("!%Y-%m-%dT%H:%M:%S", base + math.floor(index / 1000) + s - 1)
  local d = STEPS[s]
  return string.format(
    '{"reference":"%s","campaign_name":"bench","event_id":"%s:0","direction":"%s",' ..
    '"session_id":null,"user_id":"55119%08d","timestamp":"%s.000Z","channel":"RCS","type":"%s"}',
    reference, reference, d[1], index % 100000000, moment, d[2])
end

-- the next (local index, step) in the order events() in callbacks.py yields them
local function next_event()
  while slot < mine + 2 * WINDOW do
    while step < 3 do
      step = step + 1
      local i = slot - (step - 1) * WINDOW
      if i >= 0 and i < mine then return i, step end
    end
    step, slot = 0, slot + 1
  end
  return nil
end

function request()
  if verifying then
    verifying = false
    return wrk.format("POST", nil, nil, "{}")
  end
  local i, s = next_event()
  if i == nil then
    -- all sent, some not answered yet: a connection asks again with a wrong token (404,
    -- never counted) until the last real event is answered
    return wrk.format("POST", "/elsewhere/not-the-token", nil, "{}")
  end
  return wrk.format("POST", nil, nil, body(tid + i * THREADS, s))
end

function response(status, headers, b)
  if status == 404 then return end
  if status == 200 then acked = acked + 1 else refused = refused + 1 end
  local answered = acked + refused
  if answered % PROGRESS == 0 then io.write("answered ", PROGRESS, "\n"); io.flush() end
  if answered == 3 * mine then
    io.write("done\n"); io.flush()
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local a, r = 0, 0
  for _, t in ipairs(threads) do a = a + t:get("acked"); r = r + t:get("refused") end
  io.write(string.format('{"acknowledged":%d,"refused":%d,"requests":%d,"seconds":%.3f,' ..
    '"errors":%d,"p50_ms":%.2f,"p99_ms":%.2f}\n', a, r, summary.requests,
    summary.duration / 1e6, summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout, latency:percentile(50) / 1000,
    latency:percentile(99) / 1000))
end
