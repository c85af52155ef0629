import { Controller, type ExecutionContext, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** Two tokens that do not refill within a test: the third request of one identity is a 429. */
const CAPACITY = 2;
const REFILL = 0.01;

const query = (context: ExecutionContext) => context.switchToHttp().getRequest().query as Record<string, unknown>;

/** The identity is whatever the client put in `?id=`: any string the URL can carry. */
export function fromQuery(context: ExecutionContext): string {
  return query(context).id as string;
}

/** A keyBy function that misbehaves as `?kind=` asks: throws, rejects, never answers, or returns something not a string. */
export function misbehaving(context: ExecutionContext): string | Promise<string> {
  const kind = query(context).kind;
  const returned: Record<string, unknown> = {
    number: 42,
    object: { id: 'x' },
    array: ['a', 'b'],
    null: null,
    undefined: undefined,
    empty: '',
    boolean: true,
  };
  if (kind === 'throw') throw new Error('keyBy exploded');
  if (kind === 'reject') return Promise.reject(new Error('keyBy rejected'));
  if (kind === 'hang') return new Promise<string>(() => undefined);
  return returned[String(kind)] as string;
}

@Controller('hostile')
export class HostileController {
  @Get('api-key')
  @RateLimit(CAPACITY, REFILL, 'apiKey')
  apiKey() {
    return { ok: true };
  }

  @Get('user')
  @RateLimit(CAPACITY, REFILL, 'user')
  user() {
    return { ok: true };
  }

  @Get('custom')
  @RateLimit(CAPACITY, REFILL, fromQuery)
  custom() {
    return { ok: true };
  }

  @Get('misbehaving')
  @RateLimit(CAPACITY, REFILL, misbehaving)
  misbehaving() {
    return { ok: true };
  }

  @Get('ip')
  @RateLimit(CAPACITY, REFILL, 'ip')
  ip() {
    return { ok: true };
  }

  @Get('shared-ip')
  @RateLimit({ capacity: CAPACITY, refillPerSecond: REFILL, keyBy: 'ip', name: 'shared' })
  sharedIp() {
    return { ok: true };
  }

  @Get('shared-custom')
  @RateLimit({ capacity: CAPACITY, refillPerSecond: REFILL, keyBy: fromQuery, name: 'shared' })
  sharedCustom() {
    return { ok: true };
  }
}
