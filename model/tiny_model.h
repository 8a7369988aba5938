// Forwarding header: the fixture lives in model/testing/tiny_model.h (include that path).
#pragma once

#include "model/testing/tiny_model.h"
