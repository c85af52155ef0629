// Bursts of HTTP requests from a process of its own (see burst.ts): one connection per request, all
// connected before any request is written, then every request written in one synchronous loop, so the
// server reads them together, in the order written. argv: port, then a JSON array of { path, ip } (one
// burst), or an array of such arrays (rounds: each burst sent once the one before it was answered).
// Prints a JSON array of { path, status }, in the same order (an array of them for rounds).
import { connect } from 'node:net';

async function send(port, requests) {
  const sockets = await Promise.all(
    requests.map(
      () =>
        new Promise((resolve, reject) => {
          const socket = connect(port, '127.0.0.1', () => resolve(socket));
          socket.on('error', reject);
        }),
    ),
  );
  const answers = sockets.map(
    (socket, i) =>
      new Promise((resolve, reject) => {
        let text = '';
        socket.setEncoding('utf8');
        socket.on('data', (chunk) => (text += chunk));
        socket.on('error', reject);
        socket.on('end', () => resolve({ path: requests[i].path, status: Number(text.slice(9, 12)) }));
      }),
  );
  sockets.forEach((socket, i) =>
    socket.write(`GET /${requests[i].path} HTTP/1.1\r\nHost: localhost\r\nX-Forwarded-For: ${requests[i].ip}\r\nConnection: close\r\n\r\n`),
  );
  return Promise.all(answers);
}

const port = Number(process.argv[2]);
const requests = JSON.parse(process.argv[3]);
if (requests.length > 0 && Array.isArray(requests[0])) {
  const rounds = [];
  for (const round of requests) rounds.push(await send(port, round));
  process.stdout.write(JSON.stringify(rounds));
} else {
  process.stdout.write(JSON.stringify(await send(port, requests)));
}
