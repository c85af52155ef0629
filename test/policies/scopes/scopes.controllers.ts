import { Controller, Get, Module } from '@nestjs/common';
import { MessagePattern } from '@nestjs/microservices';
import { RateLimit } from 'nest-redis-rate-limit';

/**
 * Classes that share a name, as apps get them: a `UsersController` per API version, each in its own
 * module and file. Each factory call is a class of its own named as written.
 */
const SLOW = 0.001;

/** `@Controller('users')`, mounted under a module path by RouterModule (v1, v2, legacy). */
export function usersController(tag: string) {
  @Controller('users')
  class UsersController {
    @Get()
    @RateLimit(2, SLOW)
    list() {
      return { tag };
    }
  }
  return UsersController;
}

/** Nest URI versioning: `@Controller({ path: 'items', version })`, served at /v<version>/items. */
export function itemsController(version: string) {
  @Controller({ path: 'items', version })
  class ItemsController {
    @Get()
    @RateLimit(2, SLOW)
    list() {
      return { version };
    }
  }
  return ItemsController;
}

/** Different controller paths, and two stacked unnamed policies. */
export function ordersController(path: string) {
  @Controller(path)
  class OrdersController {
    @Get()
    @RateLimit(2, SLOW)
    @RateLimit(5, SLOW)
    list() {
      return { path };
    }
  }
  return OrdersController;
}

/** A class whose name nothing else has: its scope stays `HealthController.ping`. */
@Controller('health')
export class HealthController {
  @Get()
  @RateLimit(2, SLOW)
  ping() {
    return { ok: true };
  }
}

/** Microservice handlers of two same-named classes: nothing tells their routes apart. */
export function jobsController(pattern: string) {
  @Controller()
  class JobsController {
    @MessagePattern(pattern)
    @RateLimit(2, SLOW)
    handle() {
      return { pattern };
    }
  }
  return JobsController;
}

/** A module of its own around some controllers, named as an app would name it. */
export function moduleNamed(name: string, controllers: Function[]) {
  @Module({ controllers: controllers as never[] })
  class FeatureModule {}
  Object.defineProperty(FeatureModule, 'name', { value: name });
  return FeatureModule;
}
