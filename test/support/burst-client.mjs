// A burst of HTTP requests from a process of its own (see burst.ts): one connection per request, all
// connected before any request is written, then every request written in one synchronous loop, so the
// server reads them together, in the order written. argv: port, then a JSON array of { path, ip }.
// Prints a JSON array of { path, status }, in the same order.
import { connect } from 'node:net';

const port = Number(process.argv[2]);
const requests = JSON.parse(process.argv[3]);
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
process.stdout.write(JSON.stringify(await Promise.all(answers)));
