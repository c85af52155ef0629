import { Controller, type ExecutionContext, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** Capacity 10, refill 0.5/s, one bucket per client for the three levels: sheddable leaves 5, default 2, critical 0. */
const CHECKOUT = { capacity: 10, refillPerSecond: 0.5, name: 'checkout', reserve: { sheddable: 0.5, default: 0.2 } } as const;

/** What a client's `x-priority` header asks for, or something a priority function should never answer. */
function hostile(context: ExecutionContext): 'critical' | 'default' | 'sheddable' {
  const asked = context.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-priority'];
  if (asked === 'throw') throw new Error('no priority for you');
  if (asked === 'promise') return Promise.resolve('critical') as unknown as 'critical';
  if (asked === 'huge') return 'x'.repeat(100_000) as 'critical';
  return asked as 'critical';
}

/** Routes that share the bucket `checkout` at each level, and one whose level comes from the request. */
@Controller('priorities')
export class PrioritiesController {
  @Get('sheddable')
  @RateLimit({ ...CHECKOUT, priority: 'sheddable' })
  sheddable() {
    return { ok: true };
  }

  @Get('default')
  @RateLimit({ ...CHECKOUT, priority: 'default' })
  normal() {
    return { ok: true };
  }

  @Get('critical')
  @RateLimit({ ...CHECKOUT, priority: 'critical' })
  critical() {
    return { ok: true };
  }

  /** Capacity 4 with default keeping half: 2 requests at 'default', 4 at 'critical'. */
  @Get('asked')
  @RateLimit({ capacity: 4, refillPerSecond: 0.01, priority: hostile, reserve: { sheddable: 0.75, default: 0.5 } })
  asked() {
    return { ok: true };
  }
}
