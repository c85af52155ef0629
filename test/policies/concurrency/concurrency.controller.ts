import {
  BadRequestException,
  type CallHandler,
  Controller,
  type ExecutionContext,
  Get,
  Injectable,
  type NestInterceptor,
  Param,
  Sse,
  StreamableFile,
  UseInterceptors,
} from '@nestjs/common';
import { Readable } from 'node:stream';
import { Observable, timeout } from 'rxjs';
import { ConcurrencyLimit, RateLimit } from 'nest-redis-rate-limit';

/**
 * Requests a test holds open: each waits at `gate(id)` until the test opens it. `inFlight` is what the
 * handlers themselves count, the truth a limit is checked against.
 */
export class Gates {
  private readonly waiting = new Map<string, () => void>();
  private readonly opened = new Set<string>();
  inFlight = 0;
  most = 0;

  /** The ids of the handlers that ran, in order. */
  readonly entered: string[] = [];

  async gate(id: string): Promise<void> {
    this.entered.push(id);
    this.most = Math.max(this.most, ++this.inFlight);
    try {
      if (this.opened.has(id)) return;
      await new Promise<void>((resolve) => this.waiting.set(id, resolve));
    } finally {
      this.inFlight--;
    }
  }

  open(id: string): void {
    this.opened.add(id);
    this.waiting.get(id)?.();
    this.waiting.delete(id);
  }

  /** Opens every gate (after a test), and forgets which were opened. */
  async openAll(): Promise<void> {
    for (const open of this.waiting.values()) open();
    this.waiting.clear();
    for (let i = 0; i < 400 && this.inFlight > 0; i++) await new Promise((resolve) => setTimeout(resolve, 5));
    this.opened.clear();
    this.most = 0;
  }

  /** Resolves once `n` requests wait at their gates. */
  async waitingFor(n: number): Promise<void> {
    for (let i = 0; i < 400 && this.waiting.size < n; i++) await new Promise((resolve) => setTimeout(resolve, 5));
    if (this.waiting.size < n) throw new Error(`expected ${n} requests at their gates, ${this.waiting.size} are`);
  }
}

export const gates = new Gates();

/** An app's own timeout around the route (outside RateLimitInterceptor): 300 ms, then a 500; for ids `short-*` only. */
@Injectable()
export class ShortTimeout implements NestInterceptor {
  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const id: string = context.switchToHttp().getRequest<{ params: { id: string } }>().params.id;
    return id.startsWith('short-') ? next.handle().pipe(timeout(300)) : next.handle();
  }
}

/** Two in flight per client address; each request waits at its gate `id` and ends as `how` says. */
@Controller('conc')
export class ConcurrencyController {
  @Get('hold/:id/:how')
  @ConcurrencyLimit(2)
  async hold(@Param('id') id: string, @Param('how') how: string) {
    await gates.gate(id);
    if (how === 'throw') throw new Error('the handler failed');
    if (how === '400') throw new BadRequestException('bad');
    return { id };
  }

  /** Waits up to 2 s for one of its 2 slots. */
  @Get('queue/:id')
  @ConcurrencyLimit({ limit: 2, maxWaitMs: 2000, name: 'queue' })
  async queue(@Param('id') id: string) {
    await gates.gate(id);
    return { id };
  }

  /** A rate limit (5 tokens, slow refill) and 1 slot: a request refused for its slot gives its token back. */
  @Get('both/:id')
  @RateLimit(5, 0.001)
  @ConcurrencyLimit({ limit: 1, name: 'both' })
  async both(@Param('id') id: string) {
    await gates.gate(id);
    return { id };
  }

  /**
   * As `both`, with the rate policy decided after the app's guards, where the slot is: both in one store
   * call (take-with-slot.lua), and a request refused for its slot takes no token to give back.
   */
  @Get('together/:id')
  @RateLimit({ capacity: 5, refillPerSecond: 0.001, name: 'together-rate', phase: 'after-guards' })
  @ConcurrencyLimit({ limit: 1, name: 'together' })
  async together(@Param('id') id: string) {
    await gates.gate(id);
    return { id };
  }

  /** As `both`, waiting up to 3 s for the slot: a client that leaves while it waits takes no token either. */
  @Get('both-wait/:id')
  @RateLimit({ capacity: 5, refillPerSecond: 0.001, name: 'both-wait-rate' })
  @ConcurrencyLimit({ limit: 1, name: 'both-wait', maxWaitMs: 3000 })
  async bothWait(@Param('id') id: string) {
    await gates.gate(id);
    return { id };
  }

  /** One slot, waited for up to 3 s inside an app timeout of 300 ms: a request the timeout ends must not keep waiting. */
  @Get('timed/:id')
  @ConcurrencyLimit({ limit: 1, name: 'timed', maxWaitMs: 3000 })
  @UseInterceptors(ShortTimeout)
  async timed(@Param('id') id: string) {
    await gates.gate(id);
    return { id };
  }

  /** A streamed body: the slot is held until the stream has been sent. */
  @Get('file/:id')
  @ConcurrencyLimit({ limit: 1, name: 'file' })
  file(@Param('id') id: string) {
    const body = new Readable({ read() {} });
    void gates.gate(id).then(() => {
      body.push('done');
      body.push(null);
    });
    return new StreamableFile(body);
  }

  /** Server-sent events until the gate opens, then the stream completes. */
  @Sse('events/:id')
  @ConcurrencyLimit({ limit: 1, name: 'events' })
  events(@Param('id') id: string): Observable<{ data: string }> {
    return new Observable((subscriber) => {
      subscriber.next({ data: 'first' });
      void gates.gate(id).then(() => subscriber.complete());
    });
  }
}
