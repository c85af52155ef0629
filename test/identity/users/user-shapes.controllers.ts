import {
  type CanActivate,
  Controller,
  type ExecutionContext,
  Get,
  Injectable,
  Module,
  UnauthorizedException,
  UseGuards,
} from '@nestjs/common';
import { JwtModule, JwtService } from '@nestjs/jwt';
import { AuthGuard, PassportModule, PassportStrategy } from '@nestjs/passport';
import { ExtractJwt, Strategy } from 'passport-jwt';
import { RateLimit } from 'nest-redis-rate-limit';
import { JWT_SECRET } from './auth.js';

/**
 * Where apps put their user, as the NestJS docs teach it: the passport-jwt strategy of the
 * "Passport" recipe (`validate` returns `{ userId, username }`), and the guard of the "Authentication"
 * recipe, which puts the raw payload that `JwtService.verifyAsync` returns (`{ sub, username, iat }`) on
 * `request.user`. The docs' users have numeric ids.
 */
export const DOCS_USERS = { alice: { userId: 1, username: 'alice' }, bob: { userId: 2, username: 'bob' } } as const;

const SLOW = 0.001;

/** The docs' `JwtStrategy`, under its own name so that it does not replace another 'jwt' strategy. */
@Injectable()
export class DocsJwtStrategy extends PassportStrategy(Strategy, 'docs-jwt') {
  constructor() {
    super({ jwtFromRequest: ExtractJwt.fromAuthHeaderAsBearerToken(), ignoreExpiration: false, secretOrKey: JWT_SECRET });
  }

  validate(payload: { sub: number; username: string }) {
    return { userId: payload.sub, username: payload.username };
  }
}

/** The docs' hand-written `AuthGuard`: the verified payload itself becomes `request.user`. */
@Injectable()
export class PayloadAuthGuard implements CanActivate {
  constructor(private readonly jwt: JwtService) {}

  async canActivate(context: ExecutionContext): Promise<boolean> {
    const request = context.switchToHttp().getRequest();
    const [type, token] = (request.headers.authorization as string | undefined)?.split(' ') ?? [];
    if (type !== 'Bearer' || !token) throw new UnauthorizedException();
    try {
      request['user'] = await this.jwt.verifyAsync(token, { secret: JWT_SECRET });
    } catch {
      throw new UnauthorizedException();
    }
    return true;
  }
}

/** Values JSON cannot carry, by name, for `x-user-id`. */
const ODD_IDS: Record<string, unknown> = { nan: NaN, infinity: Infinity, true: true, empty: '', object: { oid: 'abc' } };

/**
 * Stands in for an app's auth guard that lets anonymous requests through: `x-user` (JSON) becomes
 * `req.user`; `x-user-id` sets `req.user = { id: <odd value> }`; neither leaves `req.user` unset.
 */
@Injectable()
export class OptionalUserGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const request = context.switchToHttp().getRequest();
    const json = request.headers['x-user'];
    const odd = request.headers['x-user-id'];
    if (typeof json === 'string') request.user = JSON.parse(json);
    else if (typeof odd === 'string') request.user = { id: ODD_IDS[odd] };
    return true;
  }
}

@Controller('docs')
export class DocsController {
  @Get('passport')
  @UseGuards(AuthGuard('docs-jwt'))
  @RateLimit(3, SLOW, 'user')
  passport() {
    return { ok: true };
  }

  @Get('payload')
  @UseGuards(PayloadAuthGuard)
  @RateLimit(3, SLOW, 'user')
  payload() {
    return { ok: true };
  }
}

/** Each route its own handler: the no-user warning is said once per route. */
@Controller('shapes')
@UseGuards(OptionalUserGuard)
export class ShapesController {
  @Get('precedence')
  @RateLimit(5, SLOW, 'user')
  precedence() {
    return { ok: true };
  }

  @Get('odd')
  @RateLimit(20, SLOW, 'user')
  odd() {
    return { ok: true };
  }

  @Get('anonymous')
  @RateLimit(5, SLOW, 'user')
  anonymous() {
    return { ok: true };
  }

  @Get('fields')
  @RateLimit(5, SLOW, 'user')
  fields() {
    return { ok: true };
  }
}

/** No guard of the app at all. */
@Controller('unguarded')
export class UnguardedController {
  @Get()
  @RateLimit(5, SLOW, 'user')
  unguarded() {
    return { ok: true };
  }
}

@Module({
  imports: [PassportModule, JwtModule.register({ secret: JWT_SECRET })],
  providers: [DocsJwtStrategy, PayloadAuthGuard, OptionalUserGuard],
  exports: [JwtModule, PayloadAuthGuard, OptionalUserGuard],
})
export class DocsAuthModule {}
