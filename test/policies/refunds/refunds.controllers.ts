import {
  BadGatewayException,
  BadRequestException,
  Body,
  type CanActivate,
  Controller,
  type DynamicModule,
  type ExecutionContext,
  Get,
  Injectable,
  Module,
  NotFoundException,
  Param,
  Post,
  Query,
  UnauthorizedException,
  UseGuards,
} from '@nestjs/common';
import { RateLimit, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';

@Injectable()
class FakeAuthGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const request = context.switchToHttp().getRequest();
    if (typeof request.headers['x-user'] === 'string') request.user = { id: request.headers['x-user'] };
    return true;
  }
}

@Controller('refunds')
export class RefundsController {
  /** Counts only failed logins: a success gives its token back. */
  @Post('login')
  @RateLimit({ capacity: 3, refillPerSecond: 0.001, refundOn: 'success' })
  login(@Body() body: { password?: string }) {
    if (body?.password !== 'right') throw new UnauthorizedException('wrong password');
    return { ok: true };
  }

  /** Upstream failures are not the client's: they give the token back. */
  @Get('upstream/:outcome')
  @RateLimit({ capacity: 2, refillPerSecond: 0.001, refundOn: 'failure' })
  upstream(@Param('outcome') outcome: string) {
    if (outcome === 'fail') throw new BadGatewayException('upstream failed');
    return { ok: true };
  }

  /** Only lookups that found nothing are refunded. */
  @Get('lookup/:id')
  @RateLimit({ capacity: 2, refillPerSecond: 0.001, refundOn: (status: number) => status === 404 })
  lookup(@Param('id') id: string) {
    if (id === 'missing') throw new NotFoundException();
    return { id };
  }

  /**
   * Capacity 5, failures given back: a failure refunds into a bucket that earlier successes have partly
   * drained, where the cap cannot hide a token too many.
   */
  @Get('partial/:outcome')
  @RateLimit({ capacity: 5, refillPerSecond: 0.001, refundOn: 'failure' })
  partial(@Param('outcome') outcome: string) {
    if (outcome === 'fail') throw new BadGatewayException('upstream failed');
    return { ok: true };
  }

  /** A refundOn that throws refunds nothing. */
  @Get('broken')
  @RateLimit({
    capacity: 2,
    refillPerSecond: 0.001,
    refundOn: () => {
      throw new Error('refundOn bug');
    },
  })
  broken() {
    return { ok: true };
  }

  /** Both phases, both refunded on success: the IP policy (guard) and the user policy (interceptor). */
  @Get('both')
  @UseGuards(FakeAuthGuard)
  @RateLimit({ name: 'both-ip', capacity: 4, refillPerSecond: 0.001, refundOn: 'success' })
  @RateLimit({ name: 'both-user', capacity: 2, refillPerSecond: 0.001, keyBy: 'user', refundOn: 'success' })
  both(@Query('fail') fail?: string) {
    if (fail) throw new BadRequestException('asked to fail');
    return { ok: true };
  }
}

export function refundsAppModule(options: RateLimitModuleOptions): DynamicModule {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [RefundsController] })
  class RefundsAppModule {}
  return { module: RefundsAppModule };
}
