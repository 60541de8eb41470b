package console

import (
	"net/http"
	"sync"
)

type job struct{}

type jobs struct {
	mu      sync.Mutex
	wg      sync.WaitGroup
	byID    map[string]*job
	running map[string]string
}

// replay is POST /dead-letters/replay.
func (c *Console) replay(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, "/jobs/x", http.StatusSeeOther)
}

// jobPage is GET /jobs/{id}.
func (c *Console) jobPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "job", page{Title: "Replay", Nav: "dead-letters"})
}
