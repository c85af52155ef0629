import { Controller, Get, Injectable, Module, UseGuards } from '@nestjs/common';
import { RateLimit, RateLimitGuard } from 'nest-redis-rate-limit';

/** Routes that only differ in what identity they use. */
@Controller('placed')
export class PlacedController {
  @Get('ip')
  @RateLimit(2, 0.001, 'ip')
  ip() {
    return { ok: true };
  }

  @Get('user')
  @RateLimit(2, 0.001, 'user')
  user() {
    return { ok: true };
  }
}

/** A per-IP burst and a per-user quota: the interceptor runs here, guard or no guard. */
@Controller('mixed')
export class MixedController {
  @Get()
  @RateLimit({ capacity: 2, refillPerSecond: 0.001, keyBy: 'ip', name: 'mixed-ip' })
  @RateLimit({ capacity: 5, refillPerSecond: 0.001, keyBy: 'user', name: 'mixed-user' })
  get() {
    return { ok: true };
  }
}

/** The client address from a header a trusted edge proxy sets, as some apps have it. */
@Injectable()
export class ClientIpGuard extends RateLimitGuard {
  protected override getIp(request: any): string | undefined {
    return request.headers['x-client-ip'] ?? super.getIp(request);
  }
}

/** A controller that places the guard itself, in a module that does not import RateLimitModule. */
@Controller('guarded')
@UseGuards(RateLimitGuard)
export class GuardedController {
  @Get()
  @RateLimit(2, 0.001, 'ip')
  get() {
    return { ok: true };
  }
}

@Module({ controllers: [GuardedController] })
export class GuardedFeatureModule {}
