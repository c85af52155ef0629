import { createServer, type Server, type Socket } from 'node:net';

/** A reply in RESP2: a status (`+OK`), an error (`-ERR ...`), a bulk string, an integer or nil. */
export type FakeReply = { status: string } | { error: string } | { bulk: string } | { integer: number } | null;

/**
 * A TCP server that speaks enough of the Redis protocol (RESP2) for a client to connect and send
 * commands, each answered by `answer` (commands arrive as arrays of strings; the name as sent, e.g.
 * `info`). For what a real Redis cannot be made to answer: an older `redis_version`, say. It records
 * every command, and counts the connections still open.
 */
export class FakeRedis {
  readonly commands: string[][] = [];
  private readonly sockets = new Set<Socket>();

  private constructor(private readonly server: Server) {}

  static async start(answer: (command: string[]) => FakeReply): Promise<FakeRedis> {
    const server = createServer();
    const fake = new FakeRedis(server);
    server.on('connection', (socket) => {
      fake.sockets.add(socket);
      socket.on('close', () => fake.sockets.delete(socket));
      socket.on('error', () => socket.destroy());
      let pending = Buffer.alloc(0);
      socket.on('data', (chunk: Buffer) => {
        pending = Buffer.concat([pending, chunk]);
        for (;;) {
          const parsed = parseCommand(pending);
          if (parsed === undefined) break;
          pending = pending.subarray(parsed.length);
          fake.commands.push(parsed.command);
          socket.write(encode(answer(parsed.command)));
        }
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return fake;
  }

  get url(): string {
    return `redis://127.0.0.1:${(this.server.address() as { port: number }).port}`;
  }

  /** Connections a client holds open now. */
  get openConnections(): number {
    return this.sockets.size;
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/** One command (`*n` then `n` bulk strings) from the start of `buffer`, with the bytes it took; undefined until it is whole. */
function parseCommand(buffer: Buffer): { command: string[]; length: number } | undefined {
  let at = 0;
  const line = (): string | undefined => {
    const end = buffer.indexOf('\r\n', at);
    if (end < 0) return undefined;
    const text = buffer.toString('latin1', at, end);
    at = end + 2;
    return text;
  };
  const header = line();
  if (header === undefined) return undefined;
  if (!header.startsWith('*')) {
    // An inline command (`PING\r\n`), as redis-cli may send.
    return { command: header.split(' ').filter(Boolean), length: at };
  }
  const count = Number(header.slice(1));
  const command: string[] = [];
  for (let i = 0; i < count; i++) {
    const size = line();
    if (size === undefined) return undefined;
    const length = Number(size.slice(1));
    if (buffer.length < at + length + 2) return undefined;
    command.push(buffer.toString('utf8', at, at + length));
    at += length + 2;
  }
  return { command, length: at };
}

function encode(reply: FakeReply): string {
  if (reply === null) return '$-1\r\n';
  if ('status' in reply) return `+${reply.status}\r\n`;
  if ('error' in reply) return `-${reply.error}\r\n`;
  if ('integer' in reply) return `:${reply.integer}\r\n`;
  return `$${Buffer.byteLength(reply.bulk)}\r\n${reply.bulk}\r\n`;
}
