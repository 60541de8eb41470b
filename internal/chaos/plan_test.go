package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/claimtx/claimtx/examples/loyalty/feed"
)

// delivery is one message as a plain (non-Watermill) producer sends it.
type delivery struct {
	eventID string
	payload []byte
	// brokerID is the AMQP message-id. A producer retry re-sends with the
	// same one, a republish (replay tool, dead-letter shovel) with a fresh
	// one; claimtx must not care either way. Kafka gives every copy a new
	// offset regardless.
	brokerID string
	bad      bool
	// customer is the order's customer id ("" for a bad message): in
	// order mode the Kafka record key, so a customer's orders share a
	// partition.
	customer string
}

// plan is what gets published and what the database must hold afterwards.
type plan struct {
	deliveries     []delivery
	orders         int
	bad            int
	redelivered    int   // orders sent more than once
	extraCopies    int   // copies beyond the first, in total
	freshIDs       int   // copies with a new broker message id
	twins          int   // copies right behind their original (processed concurrently)
	expectedPoints int64 // of the orders not rejected
	// rejected are the order ids the consumers refuse for good
	// (LOYALTY_REJECT_ORDERS), in order mode only: never credited, each
	// parked then skipped into the poison destination.
	rejected []int64
}

// customers is how many customers the plan's orders go to.
const customers = 211

// customerOf is order i's customer: orders come in runs of burst orders of
// one customer (burst 1: order i is customer i%211+1). Order mode uses
// runs of orderBurst, so a customer's orders follow each other closely
// in the stream and competing consumers or a redelivery that overtook
// them would show as out_of_order.
func customerOf(i, burst int) int64 { return int64((i/burst)%customers + 1) }

// orderBurst is order mode's run of consecutive orders per customer.
const orderBurst = 5

// rejectOrders picks about 1 in 200 of n orders, spread over customers,
// plus the second order after the first rejected one of the same
// customer, so one customer has a parked head with a later rejected order
// parked behind it (the run then has to skip twice).
func rejectOrders(n, burst int) []int64 {
	var ids []int64
	for i := 100; i <= n; i += 200 {
		ids = append(ids, int64(i))
	}
	for i, seen := 101, 0; i <= n && len(ids) > 0; i++ {
		if customerOf(i, burst) == customerOf(100, burst) {
			if seen++; seen == 2 {
				ids = append(ids, int64(i))
				break
			}
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// badPayloads cannot be keyed or decoded: the consumer must poison them and
// keep going. Their keys must not collide with a real order's: a payload
// keyed like order 7 would (rightly) be acked as a duplicate of it.
var badPayloads = []string{
	`{"order_id": `,
	`not json`,
	`{"customer_id": 5, "total_cents": 100}`,
	`{"order_id": [1], "customer_id": 1, "total_cents": 1}`,
	// A valid key (negative: no real order's), refused by the handler:
	// %d makes each one a message of its own (badPayload). With one key,
	// order mode would rightly ack the copies behind a skipped head as its
	// duplicates, and they would not reach the poison destination.
	`{"order_id": -%d, "customer_id": 1, "total_cents": -1}`,
}

// badPayload is the i-th bad message's payload.
func badPayload(i int) []byte {
	p := badPayloads[i%len(badPayloads)]
	if strings.Contains(p, "%d") {
		p = fmt.Sprintf(p, 7+i)
	}
	return []byte(p)
}

// makePlan builds n orders; about 30% of them are delivered 1-3 extra
// times, half of those copies with a fresh broker id. A quarter of the
// copies follow their original at once (twins, processed concurrently by
// competing consumers), the rest come at a random later point of the
// stream, as a republish would. bad undecodable messages are mixed in.
// Orders come in runs of burst per customer; rejected orders (order
// mode) earn no points. Every copy comes after its
// original, so each customer's orders are published in increasing order id.
func makePlan(n, bad, burst int, rejected []int64, rng *rand.Rand) plan {
	p := plan{orders: n, bad: bad, rejected: rejected}
	refused := map[int64]bool{}
	for _, id := range rejected {
		refused[id] = true
	}
	type placed struct {
		at float64
		d  delivery
	}
	all := make([]placed, 0, n+n/2+bad)
	for i := 1; i <= n; i++ {
		o := feed.Order{OrderID: int64(i), CustomerID: customerOf(i, burst), TotalCents: int64(100 + rng.IntN(100_000))}
		body, _ := json.Marshal(o) // a struct of int64s always marshals
		d := delivery{eventID: fmt.Sprintf("evt-%d", i), payload: body, brokerID: fmt.Sprintf("msg-%d-0", i),
			customer: fmt.Sprint(o.CustomerID)}
		if !refused[o.OrderID] {
			p.expectedPoints += o.TotalCents / 100
		}
		at := float64(i)
		all = append(all, placed{at, d})
		if rng.IntN(100) >= 30 {
			continue
		}
		p.redelivered++
		copies := 1 + rng.IntN(3)
		for c := 1; c <= copies; c++ {
			cp := d
			if rng.IntN(2) == 0 {
				cp.brokerID = fmt.Sprintf("msg-%d-%d", i, c)
				p.freshIDs++
			}
			cat := at + float64(c)*1e-3
			if rng.IntN(4) == 0 {
				p.twins++
			} else {
				cat = at + rng.Float64()*float64(n-i+1)
			}
			all = append(all, placed{cat, cp})
			p.extraCopies++
		}
	}
	for i := 0; i < bad; i++ {
		d := delivery{eventID: fmt.Sprintf("bad-%d", i), payload: badPayload(i),
			brokerID: fmt.Sprintf("bad-%d", i), bad: true}
		all = append(all, placed{rng.Float64() * float64(n), d})
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].at < all[j].at })
	p.deliveries = make([]delivery, len(all))
	for i, pl := range all {
		p.deliveries[i] = pl.d
	}
	return p
}
