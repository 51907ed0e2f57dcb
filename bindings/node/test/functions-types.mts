// Type checks of idempotent() (tsc -p test/tsconfig.json): the wrapped function keeps its
// parameters and returns a Promise of its (awaited) result; wrong arguments do not compile.
import { idempotent, idempotentMethod, currentCall, MemoryStore } from 'idempo';
import type { CallContext } from 'idempo';

const store = new MemoryStore();

interface Order { id: string; cents: number }
interface Receipt { order: string; charged: boolean }

const charge = idempotent(
  async (order: Order, note?: string): Promise<Receipt> => ({ order: order.id + (note ?? ''), charged: true }),
  { store, name: 'types.charge', key: (order) => order.id },
);
export const r: Promise<Receipt> = charge({ id: 'o', cents: 1 });
export const withNote: Promise<Receipt> = charge({ id: 'o', cents: 1 }, 'n');
// @ts-expect-error a wrong argument type does not compile
charge({ id: 1, cents: 1 });
// @ts-expect-error the key function sees the parameters' types
idempotent((order: Order) => order.cents, { store, key: (order) => order.missing });

const sync = idempotent((n: number) => n * 2, { store, name: 'types.double' });
export const doubled: Promise<number> = sync(2);

class Billing {
  rate = 2;
  price(order: Order): number { return order.cents * this.rate; }
}
Billing.prototype.price = idempotentMethod<[Order], number>({ store, key: (o) => o.id })(
  Billing.prototype.price,
) as unknown as Billing['price'];

export const ctx: CallContext | undefined = currentCall();
