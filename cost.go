package auditd

import (
	"encoding/json"
	"strconv"
	"strings"
)

// CostDetail is a dispatch's Detail: the cost its admission was charged
// (the records the request carries), when above 1 (`{"cost":75}`); "" for
// a request of cost 1, as every dispatch was before costs.
func CostDetail(cost int) string {
	if cost <= 1 {
		return ""
	}
	return `{"cost":` + strconv.Itoa(cost) + `}`
}

// DispatchCost is the cost dispatch e was charged: its Detail's (CostDetail),
// else 1. A Detail that does not decode, or names no cost, counts 1.
func DispatchCost(e *Event) int {
	if !strings.Contains(e.Detail, `"cost"`) {
		return 1
	}
	var d struct {
		Cost int `json:"cost"`
	}
	if json.Unmarshal([]byte(e.Detail), &d) != nil || d.Cost < 1 {
		return 1
	}
	return d.Cost
}
