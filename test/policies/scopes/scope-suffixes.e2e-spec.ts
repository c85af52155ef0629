import { Controller, Module, VERSION_NEUTRAL } from '@nestjs/common';
import { MODULE_PATH } from '@nestjs/common/constants.js';
import { WebSocketGateway } from '@nestjs/websockets';
import { scopeSuffixes } from '../../../libs/rate-limit/src/policies/route-names.js';

/** A fresh class named `name`, decorated with `decorator`: classes named alike, as separate files give them. */
function named(name: string, decorator: ClassDecorator): Function {
  const type = class {};
  decorator(type);
  return Object.defineProperty(type, 'name', { value: name });
}

describe('scopeSuffixes', () => {
  it('leaves a class whose name no other registered class has without a suffix', () => {
    const a = named('UsersController', Controller('users'));
    const b = named('OrdersController', Controller('orders'));
    expect(
      scopeSuffixes(
        new Map([
          [a, []],
          [b, []],
        ]),
        'app',
      ),
    ).toEqual(new Map());
  });

  it('tells same-named controllers apart by module path, path, version (neutral too) and host', () => {
    const v1 = named('V1Module', Module({}));
    Reflect.defineMetadata(`${MODULE_PATH}app`, '/v1/', v1);
    const a = named('UsersController', Controller('users'));
    const b = named('UsersController', Controller({ path: ['/users/', 'people'], version: ['2', VERSION_NEUTRAL] }));
    const c = named('UsersController', Controller({ path: 'users', host: 'admin.example.com' }));
    const suffixes = scopeSuffixes(
      new Map([
        [a, [v1]],
        [b, []],
        [c, []],
      ]),
      'app',
    );
    expect([...suffixes.values()]).toEqual(['@/v1/users', '@/people,/users;v=2,neutral', '@/users;host=admin.example.com']);
  });

  it('tells same-named gateways apart by port and namespace', () => {
    const a = named('ChatGateway', WebSocketGateway({ namespace: 'chat' }));
    const b = named('ChatGateway', WebSocketGateway(4001, { namespace: '/support' }));
    expect([
      ...scopeSuffixes(
        new Map([
          [a, []],
          [b, []],
        ]),
        'app',
      ).values(),
    ]).toEqual(['@ws/chat', '@ws:4001/support']);
  });

  it('replaces characters a draft-8 name or a key should not carry', () => {
    const a = named('FilesController', Controller('files/"quoted" path'));
    const b = named('FilesController', Controller('other'));
    expect(
      scopeSuffixes(
        new Map([
          [a, []],
          [b, []],
        ]),
        'app',
      ).get(a),
    ).toBe('@/files/_quoted__path');
  });
});
