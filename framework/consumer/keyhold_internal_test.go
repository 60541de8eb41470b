package consumer

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
)

// keyHold: a held key runs its messages in the order they were nacked,
// a message that ran and failed again goes first, others of the key wait
// at the end, other keys run; a key whose messages do not come back is
// let go after maxHold.
func TestKeyHold(t *testing.T) {
	key, err := framework.ParseKeySpec("template:{payload.id}")
	require.NoError(t, err)
	orderKey, err := framework.ParseKeySpec("template:{payload.account}")
	require.NoError(t, err)
	now := time.Unix(1000, 0)
	h := newKeyHold(key, orderKey, slog.New(slog.DiscardHandler))
	h.now = func() time.Time { return now }
	ev := func(account string, seq int) *message.Message {
		return message.NewMessage(fmt.Sprint(seq), []byte(fmt.Sprintf(`{"id":"%s-%d","account":%q}`, account, seq, account)))
	}
	ids := func(msgs []*message.Message) (out []string) {
		for _, m := range msgs {
			id, err := key(m)
			require.NoError(t, err)
			out = append(out, id)
		}
		return out
	}
	var back []*message.Message
	admit := func(msgs ...*message.Message) []string {
		back = nil
		return ids(h.admit(msgs, func(m *message.Message) { back = append(back, m) }))
	}

	// Two messages of a key that ran in one batch and failed: in their order.
	require.Equal(t, []string{"B-1", "B-2"}, admit(ev("B", 1), ev("B", 2)))
	h.nacked(ev("B", 1))
	h.nacked(ev("B", 2))
	require.Equal(t, []string{"B-1", "B-2"}, admit(ev("B", 2), ev("B", 1), ev("B", 2)))
	require.Equal(t, []string{"B-2"}, ids(back), "B-2 came back before B-1")
	require.Empty(t, h.held)

	require.Equal(t, []string{"K-3", "A-1"}, admit(ev("K", 3), ev("A", 1)), "nothing held: all run")
	h.nacked(ev("K", 2))
	require.Equal(t, []string{"A-2"}, admit(ev("K", 4), ev("A", 2), ev("K", 3)), "K waits for K-2")
	require.Equal(t, []string{"K-4", "K-3"}, ids(back))
	// K-2, then K-4 and K-3 in the order they were held back.
	require.Equal(t, []string{"K-2", "K-4"}, admit(ev("K", 2), ev("K", 4)))
	h.nacked(ev("K", 2)) // both ran and failed again: before K-3, in order
	h.nacked(ev("K", 4))
	require.Equal(t, []string{"K-2", "K-4"}, admit(ev("K", 4), ev("K", 2), ev("K", 4)))
	require.Equal(t, []string{"K-4"}, ids(back))
	h.nacked(ev("K", 4)) // ran and failed again: before K-3
	require.Equal(t, []string{"K-4", "K-3"}, admit(ev("K", 3), ev("K", 4), ev("K", 3)))
	require.Equal(t, []string{"K-3"}, ids(back), "K-3 came before K-4 was back")
	require.Empty(t, h.held, "every held message is back")

	h.nacked(ev("K", 5))
	require.Empty(t, admit(ev("K", 6)))
	now = now.Add(maxHold + time.Second)
	require.Equal(t, []string{"K-6"}, admit(ev("K", 6)), "K-5 never came back: K goes on")
	require.Empty(t, h.held)

	// A key let go without a later message of its own: any batch sweeps it.
	h.nacked(ev("K", 7))
	now = now.Add(maxHold + time.Second)
	require.Equal(t, []string{"A-3"}, admit(ev("A", 3)))
	require.Empty(t, h.held, "K-7 never came back: nothing is held for good")
}
