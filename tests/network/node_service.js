// The vendor's two endpoints on Node's own `http` server, counting what it received.
//
// POST /oauth/token answers a token; POST /api/v3/{basic,single,template,webhook}
// accepts every recipient; GET /_seen says how many requests of each kind arrived and
// how often each number was received, so a test can tell "the service never saw it"
// from "it may have". Listens on 127.0.0.1 on a free port and prints the port.
//
//   node node_service.js                        Node's defaults (keepAliveTimeout 5 s)
//   node node_service.js --keep-alive-ms 1000   keepAliveTimeout=1000
//   node node_service.js --idle-close-ms 300    no Keep-Alive header; an idle connection
//                                               is closed after 300 ms, and "closed"
//                                               printed once it is
//   node node_service.js --tls CERT.pem KEY.pem  HTTPS with that certificate and key
'use strict';
const fs = require('fs');
const http = require('http');
const https = require('https');

const args = process.argv.slice(2);
const option = (name) => {
  const at = args.indexOf(name);
  return at === -1 ? undefined : Number(args[at + 1]);
};
const tlsAt = args.indexOf('--tls');
const tls =
  tlsAt === -1 ? null : { cert: fs.readFileSync(args[tlsAt + 1]), key: fs.readFileSync(args[tlsAt + 2]) };
const keepAliveMs = option('--keep-alive-ms');
const idleCloseMs = option('--idle-close-ms');

const seen = { connections: 0, token: 0, dispatch: 0, numbers: {} };
let nextId = 0;

function answer(res, status, body) {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
  res.end(text);
}

function dispatched(res, raw) {
  let body;
  try {
    body = JSON.parse(raw);
  } catch (error) {
    return answer(res, 400, { error: 'invalid_json' });
  }
  seen.dispatch += 1;
  const valid = [];
  for (const message of body.messages || []) {
    seen.numbers[message.number] = (seen.numbers[message.number] || 0) + 1;
    nextId += 1;
    valid.push({ id: `msg-${nextId}`, number: message.number });
  }
  answer(res, 200, { validMessages: valid, invalidMessages: [] });
}

const handle = (req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    const raw = Buffer.concat(chunks).toString();
    if (req.method === 'POST' && req.url === '/oauth/token') {
      seen.token += 1;
      return answer(res, 200, { access_token: `token-${seen.token}`, token_type: 'Bearer', expires_in: 3600 });
    }
    if (req.method === 'POST' && /^\/api\/v3\/(basic|single|template|webhook)$/.test(req.url)) {
      return dispatched(res, raw);
    }
    if (req.method === 'GET' && req.url === '/_seen') {
      return answer(res, 200, seen);
    }
    return answer(res, 404, { error: 'not_found' });
  });
};
const server = tls === null ? http.createServer(handle) : https.createServer(tls, handle);

server.on('connection', () => { seen.connections += 1; });
if (keepAliveMs !== undefined) server.keepAliveTimeout = keepAliveMs;
if (idleCloseMs !== undefined) {
  // Like nginx's keepalive_timeout: close an idle connection without announcing when.
  server.keepAliveTimeout = 0;
  server.on('connection', (socket) => socket.on('data', () => clearTimeout(socket.idleTimer)));
  server.on('request', (req, res) => {
    const socket = req.socket;
    res.on('finish', () => {
      socket.idleTimer = setTimeout(() => {
        socket.destroy();
        process.stdout.write('closed\n');
      }, idleCloseMs);
    });
  });
}

server.listen(0, '127.0.0.1', () => process.stdout.write(`${server.address().port}\n`));
process.on('SIGTERM', () => process.exit(0));
