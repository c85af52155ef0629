import { MessageBody, type OnGatewayInit, SubscribeMessage, WebSocketGateway } from '@nestjs/websockets';
import { BucketService, ConnectionRateLimit, RateLimit } from 'nest-redis-rate-limit';

/**
 * A plain WebSocket endpoint at /ws (the ws adapter, see main.ts): 20 handshakes per address, then one
 * a second; `echo` messages 3 per connection's address, then one a second. Try from the repository:
 *   node -e "const s=new (require('ws'))('ws://127.0.0.1:3000/ws');s.on('open',()=>{for(let i=0;i<5;i++)s.send(JSON.stringify({event:'echo',data:i}))});s.on('message',m=>console.log(String(m)))"
 * Messages 0, 1 and 2 are echoed; 3 and 4 are answered {"event":"exception","data":{"status":"error","code":"RATE_LIMITED",...}}.
 * Each reply leaves when its own message is done, so the refusals usually arrive before some echoes.
 */
@WebSocketGateway({ path: '/ws' })
export class EchoGateway implements OnGatewayInit {
  private readonly connections: ConnectionRateLimit;

  constructor(buckets: BucketService) {
    this.connections = new ConnectionRateLimit(buckets, { capacity: 20, refillPerSecond: 1, name: 'ws-connect' });
  }

  /** The ws server main.ts sets up, or socket.io's when the app keeps Nest's default adapter. */
  afterInit(server: { options?: Record<string, unknown>; use?: (middleware: unknown) => void }): void {
    if (server.options !== undefined) server.options.verifyClient = this.connections.ws();
    else server.use?.(this.connections.socketIo());
  }

  @SubscribeMessage('echo')
  @RateLimit(3, 1)
  echo(@MessageBody() data: unknown) {
    return { event: 'echo', data };
  }
}
